"""inagg host library: the wire protocol's Python twin, the fixed-point codec, the aggregation
engine shared by the host aggregator and the software data plane, and the worker-side allreduce
(the communicator, its DDP hooks and the ``inagg`` torch.distributed backend)."""

__version__ = "0.1.0"
BACKEND_NAME = "inagg"   # the torch.distributed backend string (hostlib.torch_plugin)


def add_version_flag(parser) -> None:
    """``--version`` on an argparse command: every inagg command says which inagg it is."""
    parser.add_argument("--version", action="version", version=f"%(prog)s (inagg) {__version__}")
