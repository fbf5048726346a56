"""Deployments: the local one on loopback (loopback, services: ``inagg up``), the Mininet
emulation (mininet_run, topology, testbed, run_dir: ``make run``) and its topologies."""
