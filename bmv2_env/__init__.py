"""inagg.bmv2_env: the environments that run inagg without a hardware switch, the top of inagg's
three folders (hostlib < controller < bmv2_env). Its subpackages are layers (tests/test_layers.py):

  demos                                   the demos (top)
  emulation                               local deployment on loopback, Mininet emulation
  softswitch                              the software data plane (bottom)
"""
