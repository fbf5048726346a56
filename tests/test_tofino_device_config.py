"""The Tofino device config as the P4Runtime servers read it: bf_switchd's bytes read step by
step as PI reads them (p4lang/PI proto/frontend/src/device_mgr.cpp: first a try as the legacy
p4.tmp.P4DeviceConfig protobuf; then open-p4studio pkgsrc/bf-drivers/src/pi/pi_imp.c,
_pi_update_device_start), Stratum's parsed by protobuf itself from a descriptor of its
BfPipelineConfig (stratum/hal/lib/tdi/tdi.proto); both packed from the real compiled outputs."""

import json
import random
import struct

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from inagg.controller.config import DEFAULT_PUSH_TIMEOUT, default_program, parse_config
from inagg.controller.program import TOFINO_PIPELINE, read_artifact
from inagg.controller.switch import DEFAULT_RPC_TIMEOUT, SwitchConnection
from inagg.controller.tofino.config import PI_NAME_MAX, TofinoDeviceConfig

TOFINO = default_program("tofino")
LEN, BOOL, MSG = (descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
                  descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
                  descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE)
REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED


def _message_classes(package: str, messages: dict[str, list[tuple]]) -> dict:
    """Message classes built from field lists (name, number, type[, type name][, repeated]),
    so upstream's field numbers are what protobuf itself parses with."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    for name, fields in messages.items():
        msg = file.message_type.add(name=name)
        for field in fields:
            f = msg.field.add(name=field[0], number=field[1], type=field[2],
                              label=REPEATED if "repeated" in field else 1)
            if field[2] == MSG:
                f.type_name = f".{package}.{field[3]}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    # protobuf >= 4.21 has GetMessageClass; 3.20 (p4runtime's pin) only the factory
    make = getattr(message_factory, "GetMessageClass", None) or message_factory.MessageFactory(pool).GetPrototype
    return {name: make(pool.FindMessageTypeByName(f"{package}.{name}")) for name in messages}


# p4.tmp.P4DeviceConfig (PI's proto/p4/tmp/p4config.proto; extras' map is left out: a nested
# message's contents do not change whether the outer bytes parse)
P4_DEVICE_CONFIG = _message_classes("p4.tmp", {
    "Extras": [], "P4DeviceConfig": [("reassign", 1, BOOL), ("extras", 2, MSG, "Extras"),
                                     ("device_data", 3, LEN)]})["P4DeviceConfig"]
STRATUM = _message_classes("stratum.hal.tdi", {
    "Profile": [("profile_name", 1, descriptor_pb2.FieldDescriptorProto.TYPE_STRING),
                ("context", 2, LEN), ("binary", 3, LEN),
                ("pipe_scope", 4, descriptor_pb2.FieldDescriptorProto.TYPE_UINT32, "repeated")],
    "BfPipelineConfig": [("p4_name", 1, descriptor_pb2.FieldDescriptorProto.TYPE_STRING),
                         ("bfruntime_info", 2, LEN), ("profiles", 3, MSG, "Profile", "repeated")]})


def pi_device_data(p4_device_config: bytes) -> bytes:
    """What PI's DeviceMgr hands the Tofino backend: the legacy message's device_data when the
    bytes parse as a p4.tmp.P4DeviceConfig, else the bytes themselves."""
    legacy = P4_DEVICE_CONFIG()
    try:
        legacy.ParseFromString(p4_device_config)
    except DecodeError:
        return p4_device_config
    return legacy.device_data


def pi_update_device_start(data: bytes) -> dict:
    """The reads of _pi_update_device_start, in its order and with its limits: uint32 in host
    order (x86: little-endian) before each chunk, names over 100 bytes refused, the pipeline
    length always read, bfrt.json only after a non-empty pipeline name. C reads past the end
    unchecked; here that is an AssertionError."""
    at, parts = 0, {}

    def chunk(what: str, limit: int | None = None) -> bytes:
        nonlocal at
        assert at + 4 <= len(data), f"PI reads the {what} length past the end"
        (n,) = struct.unpack_from("<I", data, at)
        assert limit is None or n <= limit, f"PI_STATUS_BUFFER_ERROR: {what} of {n} bytes"
        assert at + 4 + n <= len(data), f"PI reads the {what} past the end"
        at += 4 + n
        return data[at - n:at]

    parts["prog_name"] = chunk("program name", 100).decode()
    parts["cfg"], parts["ctx"] = chunk("tofino.bin"), chunk("context.json")
    parts["p4_pipeline_name"] = chunk("pipeline name", 100).decode()
    if parts["p4_pipeline_name"]:
        parts["bfrt"] = chunk("bfrt.json")
    parts["unread"] = len(data) - at
    return parts


def real_config() -> TofinoDeviceConfig:
    files = TOFINO.files
    return TofinoDeviceConfig("inagg", read_artifact(files["binary"]), read_artifact(files["context"]),
                              TOFINO_PIPELINE, read_artifact(files["bfrt"]))


@pytest.mark.parametrize("chip", ["tofino", "tofino2"])
def test_bf_switchd_reads_every_part_of_the_packed_program_and_nothing_past_it(chip):
    """Each chip's switch gets that chip's build (p4/out/<chip>/: tofino.bin, tofino2.bin)."""
    program = parse_config({"host_aggregator": "10.0.0.100:42666", "switches": [{
        "grpc": "127.0.0.1:9559", "aggregator": "10.0.0.254:42602", "target": chip,
        "hosts": {"10.0.0.1": {"port": 1, "mac": "00:00:00:00:00:01"}}}]}).switches[0].program
    assert program.server == "bf_switchd" and program.files["binary"].name == f"{chip}.bin.gz"
    assert program.files["binary"].parent.name == chip == program.p4info_path.parent.name
    read = pi_update_device_start(pi_device_data(program.device_config()))
    assert read == {"prog_name": "inagg", "cfg": read_artifact(program.files["binary"]),
                    "ctx": read_artifact(program.files["context"]), "p4_pipeline_name": "pipe",
                    "bfrt": read_artifact(program.files["bfrt"]), "unread": 0}
    assert json.loads(read["ctx"])["target"] == chip
    if chip == "tofino":
        assert TofinoDeviceConfig.unpack(program.device_config()) == ("bf_switchd", real_config())


def test_the_three_part_packing_is_read_past_its_end():
    """What inagg packed before: PI reads a fourth length that is not there."""
    cfg = real_config()
    three = b"".join(struct.pack("<I", len(p)) + p for p in (b"inagg", cfg.binary, cfg.context))
    with pytest.raises(AssertionError, match="pipeline name length past the end"):
        pi_update_device_start(pi_device_data(three))
    with pytest.raises(ValueError, match="truncated before the pipeline name length"):
        TofinoDeviceConfig.unpack(three)


def test_the_pipeline_and_bfrt_belong_to_the_compiled_program():
    assert "Switch(pipe) main;" in (TOFINO.p4info_path.parents[2] / "tofino" / "inagg.p4").read_text()
    tables = json.loads(real_config().bfrt)["tables"]
    assert any(t["name"].startswith(f"{TOFINO_PIPELINE}.") for t in tables)


@pytest.mark.parametrize("length", range(1, PI_NAME_MAX + 1))
def test_no_name_pi_accepts_makes_the_packing_a_legacy_p4_device_config(length):
    """PI's DeviceMgr tries the bytes as a P4DeviceConfig first: every name the packer takes
    leaves the bytes unparseable as one (so they reach the reader as they are); the others
    are refused with the reason."""
    rnd = random.Random(length)
    config = TofinoDeviceConfig("p" * length, rnd.randbytes(64), b"{}", "pipe", b"{}")
    try:
        packed = config.pack("bf_switchd")
    except ValueError as e:
        assert length >= 8 and length % 8 in (1, 5) and "legacy P4DeviceConfig" in str(e)
        return
    assert pi_device_data(packed) is packed
    assert pi_update_device_start(packed)["prog_name"] == "p" * length


def test_stratum_parses_its_bf_pipeline_config_and_we_parse_stratums():
    cfg = real_config()
    packed = cfg.pack("stratum")
    msg = STRATUM["BfPipelineConfig"].FromString(packed)
    assert (msg.p4_name, msg.bfruntime_info, len(msg.profiles)) == ("inagg", cfg.bfrt, 1)
    profile = msg.profiles[0]
    assert (profile.profile_name, profile.context, profile.binary, list(profile.pipe_scope)) == \
        ("pipe", cfg.context, cfg.binary, [])
    assert TofinoDeviceConfig.unpack(msg.SerializeToString()) == ("stratum", cfg)
    msg.profiles.add(profile_name="pipe2")
    with pytest.raises(ValueError, match="2 profiles"):
        TofinoDeviceConfig.unpack(msg.SerializeToString())


def test_bad_configs_are_refused_naming_the_problem():
    cfg = real_config()
    with pytest.raises(ValueError, match="program name '' must be 1..100 bytes"):
        TofinoDeviceConfig("", cfg.binary, cfg.context, "pipe", cfg.bfrt)
    with pytest.raises(ValueError, match="pipeline name 'a/b'"):
        TofinoDeviceConfig("inagg", cfg.binary, cfg.context, "a/b", cfg.bfrt)
    with pytest.raises(ValueError, match="bfrt.json is not JSON"):
        TofinoDeviceConfig("inagg", cfg.binary, cfg.context, "pipe", b"{")
    packed = cfg.pack("bf_switchd")
    with pytest.raises(ValueError, match="binary length .* runs past the end.*BfPipelineConfig"):
        TofinoDeviceConfig.unpack(packed[:20])
    with pytest.raises(ValueError, match="1 trailing bytes"):
        TofinoDeviceConfig.unpack(packed + b"\0")
    with pytest.raises(ValueError, match="unknown P4Runtime server 'onos'"):
        cfg.pack("onos")


def test_the_config_names_the_server_of_a_tofino_only():
    base = {"host_aggregator": "10.0.0.100:42666"}
    sw = {"grpc": "127.0.0.1:9559", "aggregator": "10.0.0.254:42602", "target": "tofino",
          "hosts": {"10.0.0.1": {"port": 1, "mac": "00:00:00:00:00:01"}}}
    program = parse_config({**base, "switches": [{**sw, "p4runtime_server": "stratum"}]}).switches[0].program
    assert TofinoDeviceConfig.unpack(program.device_config()) == ("stratum", real_config())
    with pytest.raises(ValueError, match="unknown P4Runtime server 'onos'"):
        parse_config({**base, "switches": [{**sw, "p4runtime_server": "onos"}]})
    with pytest.raises(ValueError, match=r"\['p4runtime_server'\] do not belong to a bmv2 program"):
        parse_config({**base, "switches": [{**sw, "target": "bmv2", "p4runtime_server": "stratum"}]})


def test_a_refused_name_is_one_pi_would_take_for_a_legacy_config():
    """Why the packer refuses 13-byte names: this one's packing parses as a P4DeviceConfig with
    an empty device_data, which PI's DeviceMgr would assign without loading the program."""
    name = "xZb" + "p" * 10   # 0x0d: fixed32 over the zeros; "Z": field 11, bytes; "b": 98 of them
    parts = (name.encode(), b"B" * 64, b"{}", b"pipe", b"{}")
    raw = b"".join(struct.pack("<I", len(p)) + p for p in parts)
    assert pi_device_data(raw) == b""
    with pytest.raises(ValueError, match="13-byte program name .* legacy P4DeviceConfig"):
        TofinoDeviceConfig(name, b"B" * 64, b"{}", "pipe", b"{}").pack("bf_switchd")


def test_the_pipeline_push_has_its_own_deadline_from_the_config():
    """A Tofino config is 7-8 MB that bf_switchd writes into the chip before it answers: the
    push gets ``push_timeout`` (default DEFAULT_PUSH_TIMEOUT), not the 10 s of other calls."""
    base = {"host_aggregator": "10.0.0.100:42666"}
    sw = {"grpc": "127.0.0.1:9559", "aggregator": "10.0.0.254:42602", "target": "tofino",
          "hosts": {"10.0.0.1": {"port": 1, "mac": "00:00:00:00:00:01"}}}
    default = parse_config({**base, "switches": [sw]}).switches[0]
    assert default.push_timeout == DEFAULT_PUSH_TIMEOUT >= 60 > DEFAULT_RPC_TIMEOUT
    for bad in (0, -5, "30", True):
        with pytest.raises(ValueError, match="push_timeout"):
            parse_config({**base, "switches": [{**sw, "push_timeout": bad}]})
    cfg = parse_config({**base, "switches": [{**sw, "push_timeout": 300}]}).switches[0]
    pushed = {}

    class Stub:
        def SetForwardingPipelineConfig(self, req, timeout):
            pushed.update(timeout=timeout, size=len(req.config.p4_device_config))

    # the session without its connection (the constructor arbitrates with a live switch)
    conn = SwitchConnection.__new__(SwitchConnection)
    conn.device_id, conn.election_id, conn.program, conn.stub = 0, (0, 1), cfg.program, Stub()
    conn.push_timeout = cfg.push_timeout
    conn.push_pipeline()
    assert pushed["timeout"] == 300
    assert 6_000_000 < pushed["size"] < 9_000_000   # docs/tofino.md: "about 7 MB (Tofino 2: 8)"
