"""PyTorch on top of the worker side: the ``inagg`` torch.distributed backend (backend, the c10d
front over lifecycle, dispatch, reduce_scatter, inner_gloo and works; plugin), its path choice
and agreement across ranks, and the DDP comm hooks (hooks)."""
