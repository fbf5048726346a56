"""The software target's P4Info (tools/soft_p4info.py, ``make build``): the BMv2 program's
P4Info at the software target's own K, regenerated from the committed one."""

import pytest

from inagg.controller.config import default_program
from inagg.controller.p4info import P4Info, same_p4info, same_program
from inagg.hostlib.wire.protocol import SWITCH_VALUES_PER_PACKET
from tools.soft_p4info import main, soft_p4info_text


def test_the_committed_soft_p4info_is_current():
    """Fails when p4/out/bmv2/inagg.p4info.txtpb changed and `make build` was not rerun."""
    soft = default_program("soft")
    source = default_program("bmv2").p4info_path.read_text()
    assert soft.p4info_path.read_text() == soft_p4info_text(source, soft.p4info.values_per_packet)


def test_it_is_the_bmv2_program_at_another_k():
    soft, bmv2 = default_program("soft").p4info, default_program("bmv2").p4info
    assert soft.values_per_packet > bmv2.values_per_packet == SWITCH_VALUES_PER_PACKET
    assert same_program(soft.message, bmv2.message) and not same_p4info(soft.message, bmv2.message)
    assert default_program("soft").device_config() == default_program("bmv2").device_config()


def test_generation(tmp_path):
    out = tmp_path / "soft" / "p4info.txtpb"
    assert main(["--source", str(default_program("bmv2").p4info_path), "--values-per-packet", "300",
                 "--out", str(out)]) == 0
    assert P4Info.load(out).values_per_packet == 300
    with pytest.raises(ValueError, match="must be >= 1"):
        soft_p4info_text(out.read_text(), 0)
    with pytest.raises(ValueError, match="has 0 @inagg_values_per_packet annotations"):
        soft_p4info_text('pkg_info { name: "inagg" }\n', 64)
