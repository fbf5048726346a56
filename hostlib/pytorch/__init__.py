"""PyTorch on top of the worker side: the ``inagg`` torch.distributed backend (backend, plugin),
its path choice and agreement across ranks, and the DDP comm hooks (hooks)."""
