"""inagg.controller: the control plane, the middle of inagg's three folders (hostlib < controller <
bmv2_env); it uses hostlib's wire, jobservice and root only. Its layers (tests/test_layers.py):

  controller (this folder's modules)      the controller (controller, jobs, fabric, grants,
                                          allocator, runtime, store), its gRPC service, its
                                          P4Runtime client (switch, p4info, program), config,
                                          metrics, the commands (cli, tofino_ports_cli)
  tofino                                  the Tofino device config and ports (bottom)
"""
