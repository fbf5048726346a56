"""A worker host's neighbour entry for the switch's aggregator address: read from the kernel's
table, and the warning (with the command that fixes it) when it is missing or wrong."""

from pathlib import Path

from inagg.hostlib.worker.neighbour import ARP_TABLE, kernel_neighbour, neighbour_problem

HEADER = "IP address       HW type     Flags       HW address            Mask     Device\n"
AGG, MAC = "10.0.0.254", "02:00:00:00:00:fe"


def arp_table(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "arp"
    path.write_text(HEADER + "".join(row + "\n" for row in rows))
    return path


def test_a_static_entry_with_the_granted_mac_is_no_problem(tmp_path):
    table = arp_table(tmp_path, f"{AGG}       0x1         0x6         02:00:00:00:00:FE     *        eth1")
    assert kernel_neighbour(AGG, table) == MAC
    assert neighbour_problem(AGG, MAC, table) == ""


def test_a_missing_incomplete_or_other_entry_is_said_with_the_fix(tmp_path):
    incomplete = arp_table(tmp_path, f"{AGG}       0x1         0x0         00:00:00:00:00:00     *        eth1")
    assert kernel_neighbour(AGG, incomplete) is None
    problem = neighbour_problem(AGG, MAC, incomplete)
    assert "has no neighbour entry for it" in problem
    assert f"as root: ip neigh replace {AGG} lladdr {MAC} nud permanent" in problem
    other = arp_table(tmp_path, f"{AGG}       0x1         0x2         02:00:00:00:00:01     *        eth1")
    assert "this host maps it to 02:00:00:00:00:01" in neighbour_problem(AGG, MAC, other)


def test_without_a_table_nothing_is_claimed(tmp_path):
    assert neighbour_problem(AGG, MAC, tmp_path / "absent") == ""


def test_the_kernels_own_table_reads(tmp_path):
    if ARP_TABLE.is_file():
        kernel_neighbour(AGG, ARP_TABLE)   # parses whatever the host has
        assert neighbour_problem("127.0.0.1", MAC) != ""   # loopback has no neighbour entries
