"""CUDA tensors through a communicator: staged through pinned host memory, the copies on a CUDA
stream of their own.

The network side reads and writes host memory, so a CUDA tensor's values go to a pinned host
buffer and its result comes back from it. The device-to-host copy is queued when the call is
submitted, on the communicator's copy stream, after the work the caller's stream had queued up
to then (an event: DDP writes a bucket on its stream and submits it at once); the caller does
not wait for it. The communicator's I/O thread meanwhile runs the calls submitted before, so a
bucket's copy overlaps the previous bucket's network time; the I/O thread waits for the copy
only when the call's turn comes (``ready``). The result goes back on the copy stream too, and
the call completes once it is there (``finish``), so whoever waits on the call's future reads
the reduced tensor on any stream. Pinned buffers are kept for reuse by size (pinning memory
costs far more than a copy); a buffer serves one call at a time.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass

import numpy as np


@dataclass
class StagedCall:
    """One CUDA tensor's call: the tensor, its pinned host copy (and that copy's numpy view, what
    the stream reduces) and the event that says the copy to the host is done."""

    tensor: object      # torch.Tensor on a CUDA device
    host: object        # pinned torch.Tensor, same dtype and size
    values: np.ndarray
    copied: object      # torch.cuda.Event


class CudaStaging:
    """One communicator's copy streams (one per device) and pinned buffers (module docstring)."""

    def __init__(self) -> None:
        self._streams: dict = {}
        self._free: dict[tuple, list] = defaultdict(list)   # (dtype, numel) -> pinned buffers
        self._lock = threading.Lock()   # calls are staged on callers' threads, finished on the I/O thread

    def stage(self, tensor, numpy_view) -> StagedCall:
        """Queue ``tensor``'s copy to a pinned buffer on its device's copy stream, after what
        the caller's current stream queued so far; returns at once. ``numpy_view(host)``: the
        flat array the stream reduces."""
        import torch

        stream = self._stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        host = self._buffer(tensor)
        copied = torch.cuda.Event()
        with torch.cuda.stream(stream):
            host.copy_(tensor.view(-1), non_blocking=True)
            copied.record(stream)
        tensor.record_stream(stream)   # the allocator keeps its memory until the copies are done
        return StagedCall(tensor, host, numpy_view(host), copied)

    @staticmethod
    def ready(call: StagedCall) -> None:
        """Wait until the call's values are in host memory (its turn on the I/O thread)."""
        call.copied.synchronize()

    def finish(self, call: StagedCall) -> None:
        """Copy the result back into the CUDA tensor on the copy stream and wait for it; the
        pinned buffer is free again."""
        import torch

        stream = self._stream(call.tensor.device)
        back = torch.cuda.Event()
        with torch.cuda.stream(stream):
            call.tensor.view(-1).copy_(call.host, non_blocking=True)
            back.record(stream)
        back.synchronize()   # not the later calls' copies to host queued behind it
        self.release(call)

    def release(self, call: StagedCall) -> None:
        """The call's pinned buffer back to the pool (a call that failed: the tensor is left as it was)."""
        with self._lock:
            self._free[(call.host.dtype, call.host.numel())].append(call.host)

    def _stream(self, device):
        import torch

        with self._lock:
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device)
            return self._streams[device]

    def _buffer(self, tensor):
        import torch

        with self._lock:
            free = self._free[(tensor.dtype, tensor.numel())]
            if free:
                return free.pop()
        return torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=True)
