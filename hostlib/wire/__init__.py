"""The wire format and what frames it, at the bottom of inagg: the header and its constants
(protocol, the twin of p4/include), grants and MTU arithmetic (grant), the fixed-point codec
(codec), RoCEv2 framing (roce), UDP sockets (transport) and the scapy dissector (scapy_layer).
Imports nothing of inagg above it."""
