"""The controller's Tofino parts, below its config: the device config PI's Tofino target reads
(config), front-panel ports and what they need (ports), the port map and its bfrt script
(port_map, bfrt_port_script). ``inagg-tofino-ports`` (controller/tofino_ports_cli.py) drives
them from a parsed config."""
