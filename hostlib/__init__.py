"""inagg.hostlib: what runs on a training host, the bottom of inagg's three folders (hostlib <
controller < bmv2_env). Its subpackages are layers; each imports only those below it
(tests/test_layers.py holds the table and checks every import, lazy ones included):

  pytorch                                 torch.distributed backend, path choice, DDP hooks
  worker | aggregator                     worker side, host aggregator
  wire | jobservice | hostlib             wire format, codec, job-service client; version, errors,
                                          the C++ loader, python -m commands (launch) (bottom)
"""

__version__ = "0.1.0"
BACKEND_NAME = "inagg"   # the torch.distributed backend string (inagg.hostlib.pytorch.plugin)
BACKEND_DEVICES = ("cpu", "cuda")   # the device types it takes (a CUDA tensor staged through host memory)


def add_version_flag(parser) -> None:
    """``--version`` on an argparse command: every inagg command says which inagg it is."""
    parser.add_argument("--version", action="version", version=f"%(prog)s (inagg) {__version__}")
