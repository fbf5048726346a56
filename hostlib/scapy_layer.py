"""scapy layer for inagg, generated from ``protocol.HEADER_FIELDS`` so it cannot drift.

``import hostlib.scapy_layer`` binds it to the default UDP port (both directions); call
``bind_port(p)`` for a deployment using another port. Then ``rdpcap`` shows decoded packets.
"""

from __future__ import annotations

from scapy.fields import BitField, FieldListField, SignedByteField, SignedIntField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from .protocol import HEADER_FIELDS, MSG_CONTRIBUTION, UDP_PORT, VERSION


def _field(name: str, width: int, signed: bool):
    if signed:
        if width != 8:
            raise NotImplementedError(f"signed field {name} of width {width}")
        return SignedByteField(name, 0)
    return BitField(name, 0, width)


class Inagg(Packet):
    name = "inagg"
    fields_desc = [_field(*f) for f in HEADER_FIELDS] + [
        FieldListField("values", [], SignedIntField("value", 0)),
    ]

    def mysummary(self) -> str:
        kind = "contrib" if self.msg_type == MSG_CONTRIBUTION else "result"
        return self.sprintf(
            f"inagg {kind} job=%job_id% w=%worker_id% slot=%slot%/%slot_set% off=%offset% n=%count%"
        )


# Sensible defaults for a hand-built packet.
Inagg.fields_desc[0].default = VERSION
Inagg.fields_desc[1].default = MSG_CONTRIBUTION


def bind_port(port: int) -> None:
    bind_layers(UDP, Inagg, dport=port)
    bind_layers(UDP, Inagg, sport=port)


bind_port(UDP_PORT)
