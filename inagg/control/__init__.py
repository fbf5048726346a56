"""The control plane: the controller (service, runtime, allocator, store), its P4Runtime client
(switch, p4info, program), configuration, metrics and the ``inagg-controller`` / ``inaggctl``
commands."""
