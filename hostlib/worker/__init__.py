"""The worker side: the communicator (one job's allreduce over the switch or the host aggregator),
its slot streams (stream, the Python reference; native_stream, the C++ one), the link cost model,
AR-Topk and the discovery of a local deployment."""
