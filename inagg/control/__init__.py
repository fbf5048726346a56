"""The control plane: the controller (controller, jobs, fabric, grants, allocator, runtime, store),
its gRPC service (service), its P4Runtime client (switch, p4info, program), configuration, metrics
and the ``inagg-controller`` / ``inaggctl`` commands."""
