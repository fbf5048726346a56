"""The emulation's workloads: a small model zoo and synthetic gradient profiles, sized so that
four jobs train at once on a 2-core machine.

* ``mlp``: the training demo's 9,610-parameter MLP on scikit-learn's digits (64 -> 128 -> 10).
* ``cnn``: two 3x3 convolutions and two linear layers on the same digits as 8x8 images
  (38,282 parameters).
* ``transformer``: a two-layer causal transformer language model (d 64, 4 heads, vocabulary
  32, sequences of 16 tokens; 72,096 parameters) on token sequences drawn from a seeded Markov
  chain, so its next-token accuracy has something to learn.

Every model maps a batch of inputs to logits whose last axis is the class (``loss`` and
``accuracy`` flatten the others), and every data set has the digits' 1,797 samples, so the
training loop (train_demo._train) and its steps per epoch are the same for all.

A synthetic profile (``{"bucket_bytes": [...], "compute_ms": ...}``) has no model: each step
waits its compute time, then allreduces one float32 tensor per bucket (train_demo._profile_steps):
the traffic of a model of that shape without its arithmetic. ``MODELS`` here and
``topology_schema.MODELS`` name the same zoo (tests/test_workloads.py holds them together).
"""

from __future__ import annotations

import numpy as np

VOCAB, SEQ = 32, 16          # the transformer's vocabulary and sequence length
SAMPLES = 1797               # every data set's size (the digits')


def markov_tokens(seed: int, n: int = SAMPLES) -> np.ndarray:
    """``n`` sequences of SEQ + 1 tokens from a seeded Markov chain whose every token has two
    likely successors (80 % of the mass), so the next token is learnable but not certain."""
    rng = np.random.default_rng([seed, 7])
    probs = np.full((VOCAB, VOCAB), 0.2 / (VOCAB - 2))
    for t in range(VOCAB):
        probs[t, rng.choice(VOCAB, 2, replace=False)] = 0.4
    probs /= probs.sum(1, keepdims=True)
    out = np.empty((n, SEQ + 1), np.int64)
    out[:, 0] = rng.integers(VOCAB, size=n)
    for i in range(1, SEQ + 1):
        cum = probs[out[:, i - 1]].cumsum(1)
        out[:, i] = (rng.random((n, 1)) < cum).argmax(1)
    return out


def load_data(model: str, seed: int = 0) -> tuple:
    """(x_train, y_train, x_test, y_test) of ``model``'s data set, split 80/20 by the seed."""
    if model == "transformer":
        seqs = markov_tokens(seed)
        x, y = seqs[:, :-1], seqs[:, 1:]
    else:
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def _transformer():
    """The causal transformer LM: token and position embeddings, two pre-norm encoder layers
    under a causal mask, a linear head."""
    import torch

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = torch.nn.Embedding(VOCAB, 64)
            self.pos = torch.nn.Parameter(torch.zeros(SEQ, 64))
            layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
            self.body = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(64, VOCAB)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(SEQ))

        def forward(self, x):
            return self.head(self.body(self.tok(x) + self.pos, mask=self.mask, is_causal=True))

    return TinyLM()


def build_model(name: str, hidden: int = 128):
    """A fresh model of the zoo (the caller seeds torch first, so every rank builds the same)."""
    import torch

    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    if name == "cnn":
        return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))
    if name == "transformer":
        return _transformer()
    raise ValueError(f"unknown model {name!r}; the zoo has {', '.join(MODELS)}")


MODELS = ("mlp", "cnn", "transformer")


def loss(logits, y):
    """Cross-entropy over every position (one per sample, or one per token)."""
    import torch

    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def accuracy(logits, y) -> float:
    """The share of positions whose largest logit is the target."""
    return float((logits.argmax(-1) == y).float().mean())


def profile_tensors(profile: dict) -> list:
    """One float32 tensor per bucket of a synthetic profile (``bucket_bytes``, multiples of 4)."""
    import torch

    return [torch.ones(n // 4, dtype=torch.float32) for n in profile["bucket_bytes"]]
