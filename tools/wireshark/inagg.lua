-- Wireshark dissector for inagg, the in-network aggregation protocol (hostlib/wire/protocol.py is
-- the Python twin of p4/include/headers.p4; this file follows the same header, field by field).
--
-- Decodes the 16-byte inagg header and the int32 values after it:
--   * on UDP port 0xA66A (42602, the switch's inagg port) and 42666 (the host aggregator's
--     default port), both directions; Wireshark reassembles host-aggregator datagrams that were
--     IP-fragmented (larger than the link's MTU) itself;
--   * inside RoCEv2 (UDP 4791: BTH / RETH / ImmDt ... ICRC) as a heuristic on the InfiniBand
--     payload, when the immediate data is "INAG" (0x494E4147).
--
-- Install: copy to ~/.local/lib/wireshark/plugins/ (or run tshark -X lua_script:inagg.lua).
-- Filter fields: inagg.job_id, inagg.worker_id, inagg.slot, inagg.round_tag, inagg.offset,
-- inagg.value, ...

local inagg = Proto("inagg", "In-network aggregation (inagg)")

local MSG_TYPES = { [1] = "contribution", [2] = "result" }
local FLAG_NAMES = { [0x01] = "retransmit", [0x02] = "from_host", [0x04] = "congestion", [0x08] = "overflow",
                     [0x80] = "from_switch" }
-- a contribution's 0x02 is MINE (a reduce-scatter's block in the sender's shard): only results are FROM_HOST
local CONTRIBUTION_FLAG_NAMES = { [0x02] = "mine" }
local HEADER_BYTES = 16
local INAGG_UDP_PORT = 0xA66A
local HOST_AGGREGATOR_PORT = 42666
local INAGG_IMMEDIATE = "494e4147"   -- "INAG"

local f = {
    version   = ProtoField.uint8("inagg.version", "Version", base.DEC, nil, 0xF0),
    msg_type  = ProtoField.uint8("inagg.msg_type", "Message type", base.DEC, MSG_TYPES, 0x0F),
    flags     = ProtoField.uint8("inagg.flags", "Flags", base.HEX),
    job_id    = ProtoField.uint16("inagg.job_id", "Job", base.DEC),
    worker_id = ProtoField.uint8("inagg.worker_id", "Worker", base.DEC),
    exp       = ProtoField.int8("inagg.exp", "Exponent", base.DEC),
    epoch     = ProtoField.uint16("inagg.epoch", "Epoch", base.DEC),
    slot_set  = ProtoField.uint16("inagg.slot_set", "Slot set", base.DEC, nil, 0x8000),
    slot      = ProtoField.uint16("inagg.slot", "Slot", base.DEC, nil, 0x7FFF),
    count     = ProtoField.uint16("inagg.count", "Count", base.DEC),
    offset    = ProtoField.uint32("inagg.offset", "Offset", base.DEC),
    -- flags bits 4..6 are no flags: the round's tag beyond its set (ROUND_TAG_MASK, constants.p4)
    round_tag = ProtoField.uint8("inagg.round_tag", "Round tag", base.DEC, nil, 0x70),
    values    = ProtoField.bytes("inagg.values", "Values"),
    value     = ProtoField.int32("inagg.value", "Value", base.DEC),
    n_values  = ProtoField.uint32("inagg.n_values", "Values carried", base.DEC),
}
inagg.fields = f

local immdt_field = Field.new("infiniband.immdt")

local function flag_text(flags, kind)
    local names = {}
    for bit, name in pairs(FLAG_NAMES) do
        if kind == "contribution" and CONTRIBUTION_FLAG_NAMES[bit] then name = CONTRIBUTION_FLAG_NAMES[bit] end
        if bit32.band(flags, bit) ~= 0 then names[#names + 1] = name end
    end
    table.sort(names)
    return #names > 0 and table.concat(names, ",") or "none"
end

local function dissect(tvb, pinfo, tree)
    if tvb:len() < HEADER_BYTES then return 0 end
    pinfo.cols.protocol = "inagg"
    local t = tree:add(inagg, tvb(0, tvb:len()))
    local kind = MSG_TYPES[bit32.band(tvb(0, 1):uint(), 0x0F)] or "unknown"
    local flags = tvb(1, 1):uint()
    t:add(f.version, tvb(0, 1))
    t:add(f.msg_type, tvb(0, 1))
    t:add(f.flags, tvb(1, 1)):append_text(" (" .. flag_text(flags, kind) .. ")")
    t:add(f.round_tag, tvb(1, 1))
    t:add(f.job_id, tvb(2, 2))
    t:add(f.worker_id, tvb(4, 1))
    t:add(f.exp, tvb(5, 1))
    t:add(f.epoch, tvb(6, 2))
    t:add(f.slot_set, tvb(8, 2))
    t:add(f.slot, tvb(8, 2))
    t:add(f.count, tvb(10, 2))
    t:add(f.offset, tvb(12, 4))
    local n = math.floor((tvb:len() - HEADER_BYTES) / 4)
    t:add(f.n_values, n):set_generated()
    if n > 0 then
        local vt = t:add(f.values, tvb(HEADER_BYTES, n * 4))
        for i = 0, n - 1 do
            vt:add(f.value, tvb(HEADER_BYTES + 4 * i, 4))
        end
    end
    pinfo.cols.info = string.format("inagg %s job=%d w=%d slot=%d/%d off=%d n=%d",
        kind, tvb(2, 2):uint(), tvb(4, 1):uint(), bit32.band(tvb(8, 2):uint(), 0x7FFF),
        bit32.rshift(tvb(8, 2):uint(), 15), tvb(12, 4):uint(), tvb(10, 2):uint())
    return tvb:len()
end

function inagg.dissector(tvb, pinfo, tree)
    return dissect(tvb, pinfo, tree)
end

-- RoCEv2: the InfiniBand dissector hands the RDMA WRITE's payload (ICRC excluded) to heuristics
local function roce_heuristic(tvb, pinfo, tree)
    local imm = immdt_field()
    if imm == nil or tostring(imm.range:bytes()):lower() ~= INAGG_IMMEDIATE then return false end
    return dissect(tvb, pinfo, tree) > 0
end

local udp_table = DissectorTable.get("udp.port")
udp_table:add(INAGG_UDP_PORT, inagg)
udp_table:add(HOST_AGGREGATOR_PORT, inagg)
inagg:register_heuristic("infiniband.payload", roce_heuristic)
