"""The host library's own exception types, so callers can catch inagg failures by type (and tell
them from torch's own) even where they cross torch.futures or DDP's C++ reducer."""

from __future__ import annotations


class InaggError(RuntimeError):
    """Base of the errors the inagg host library raises for its own reasons."""


class InaggSetupError(InaggError):
    """The job could not be connected to inagg: no controller reachable, the local deployment
    did not start, or this rank's address could not be found. The message says which and what
    to set."""


class InaggHookError(InaggError):
    """A DDP communication hook of inagg failed; the message names the hook, the job and the
    rank, and ``__cause__`` is the original error."""


class JobFailed(RuntimeError):
    """The controller failed the job (a rank stopped); the message names the rank(s)."""
