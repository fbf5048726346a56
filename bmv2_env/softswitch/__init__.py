"""The software data plane ``inagg-soft-switch``: the P4 pipeline in Python (pipeline_reference,
the specification) and its C++ twin (pipeline), the P4Runtime server BMv2's simple_switch_grpc
offers, and the switch state it reads and writes."""
