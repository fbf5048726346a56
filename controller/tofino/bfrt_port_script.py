"""The port bring-up script of a Tofino switch: a bfrt_python program the operator runs in
bf_switchd's shell (``bfshell -b <script>``), written from the switch's ``ports`` section
(controller/tofino/ports.py).

For each front-panel port, in BF Runtime's port tables (open-p4studio
``pkgsrc/bf-drivers/src/bf_rt/bf_rt_port/bf_rt_port_tf1.json``; bfrt_python names a port table
``bfrt.port.<name without $, lower case>`` and its fields without the ``$``):

1. ``$PORT_HDL_INFO``, keyed by ``$CONN_ID`` and ``$CHNL_ID``, gives the connector's
   ``$DEV_PORT`` (the board's port map, which only bf_switchd knows);
2. ``$PORT``, keyed by ``$DEV_PORT``: the port is added with ``$SPEED``, ``$FEC``,
   ``$AUTO_NEGOTIATION`` and ``$LOOPBACK_MODE`` (MAC loopback for the switch's
   ``loopback_ports``, none for the others; deleted first when it exists, so a second run
   applies the config again), then enabled (``$PORT_ENABLE``), as ucli's ``pm port-add`` and ``pm port-enb``;
3. the resulting map is printed as one line, ``inagg-port-map {JSON}``, with the switch's name
   and, by front-panel port, the connector and device port; ``inagg-tofino-ports map`` reads it
   (controller/tofino/port_map.py).

The script's own code is fixed (_BODY); only its data (the switch and its ports) varies.
"""

from __future__ import annotations

from inagg.controller.tofino.ports import PortedSwitch

MAP_MARK = "inagg-port-map"
# $LOOPBACK_MODE of a port not in loopback, and of one the switch recirculates through (its
# config's loopback_ports: MAC loopback, docs/tofino.md "Recirculation capacity per pipe")
LOOPBACK_MODES = {False: "BF_LPBK_NONE", True: "BF_LPBK_MAC_NEAR"}

_BODY = '''
def device_port(conn, chnl):
    """The device port of connector conn, channel chnl ($PORT_HDL_INFO)."""
    entry = bfrt.port.port_hdl_info.get(CONN_ID=conn, CHNL_ID=chnl, print_ents=False)
    if entry == -1:
        raise RuntimeError("inagg: this board has no port %d/%d ($PORT_HDL_INFO has no entry): "
                           "fix its connector in the switch's ports section" % (conn, chnl))
    return entry.data[b"$DEV_PORT"]


def bring_up(dev_port, speed, fec, autoneg, loopback):
    """$PORT: add the port with its speed, FEC, autonegotiation and loopback mode, then
    enable it."""
    port = bfrt.port.port
    if port.get(DEV_PORT=dev_port, print_ents=False) != -1:
        port.delete(DEV_PORT=dev_port)
    port.add(DEV_PORT=dev_port, SPEED=speed, FEC=fec, AUTO_NEGOTIATION=autoneg,
             LOOPBACK_MODE=loopback)
    port.mod(DEV_PORT=dev_port, PORT_ENABLE=True)


def inagg_ports():
    ports = {}
    for front_panel, conn, chnl, speed, fec, autoneg, loopback in PORTS:
        dev_port = device_port(conn, chnl)
        bring_up(dev_port, speed, fec, autoneg, loopback)
        ports[str(front_panel)] = {"connector": "%d/%d" % (conn, chnl), "dev_port": dev_port}
    print(MAP_MARK + " " + json.dumps({"switch": SWITCH, "ports": ports}, sort_keys=True))


inagg_ports()
'''


def port_script(sw: PortedSwitch, source: str) -> str:
    """The bring-up script of switch ``sw`` (``source``: the config file it came from, named in
    the script's header); ValueError when the switch has no ``ports`` section."""
    if not sw.port_setup:
        raise ValueError(f"switch {sw.name} has no ports section: add one saying how each "
                         f"front-panel port comes up (docs/tofino.md, step 5)")
    rows = []
    for number in sorted(sw.port_setup):
        p = sw.port_setup[number]
        loopback = LOOPBACK_MODES[number in sw.loopback_ports]
        rows.append(f"    ({p.front_panel}, {p.conn}, {p.chnl}, "
                    + ", ".join(repr(v) for v in (*p.sde_values(), loopback)) + "),")
    header = (f'"""inagg: bring up the ports of switch {sw.name!r} (written by inagg-tofino-ports '
              f'from {source}).\nRun in bf_switchd\'s shell: bfshell -b <this file>; then feed '
              f'its output to\n`inagg-tofino-ports map`."""\n\nimport json\n\n')
    data = (f"SWITCH = {sw.name!r}\nMAP_MARK = {MAP_MARK!r}\n"
            "# front-panel port, connector, channel, $SPEED, $FEC, $AUTO_NEGOTIATION, $LOOPBACK_MODE\n"
            "PORTS = [\n" + "\n".join(rows) + "\n]\n\n\n")
    return header + data + _BODY.lstrip("\n")
