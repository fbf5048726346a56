"""The worker side: the communicator (one job's allreduce over the switch or the host aggregator),
its slot streams (stream, the C++ one, and stream_reference, its Python specification, over
call_protocol, rounds and stream_base), what both communicators take (tensors: light, so a job
on one host imports no switch communicator), the link cost model,
AR-Topk and the discovery of a local deployment."""
