"""inagg: in-network aggregation of gradients. The subpackages are layers; each imports only those
below it (tests/test_layers.py checks every import, lazy ones included):

  demos                                   the demos (top)
  emulation                               local deployment on loopback, Mininet emulation
  softswitch                              the software data plane
  pytorch                                 torch.distributed backend, DDP hooks
  worker | control | aggregator           worker side, control plane, host aggregator
  wire | jobservice | inagg (this module) wire format, codec, job-service client (bottom)
"""

__version__ = "0.1.0"
BACKEND_NAME = "inagg"   # the torch.distributed backend string (inagg.pytorch.plugin)


def add_version_flag(parser) -> None:
    """``--version`` on an argparse command: every inagg command says which inagg it is."""
    parser.add_argument("--version", action="version", version=f"%(prog)s (inagg) {__version__}")
