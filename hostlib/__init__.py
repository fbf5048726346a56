"""inagg host library: the wire protocol's Python twin, the fixed-point codec, the aggregation
engine shared by the host aggregator and the software data plane, and the worker-side allreduce."""

__version__ = "0.1.0"
