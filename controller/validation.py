"""Checks of every value a job-service request carries, before any of it is used.

The job service answers anyone who can reach it (CreateJob needs no credential), so each field is
bounded here: a NaN demand, a 3 MB name, a 100 kB hostname or an embedded NUL must be refused with
a message naming the field, never stored, placed or handed to the host aggregator. Each check
raises ``ValueError``; the service answers INVALID_ARGUMENT with its message.
"""

from __future__ import annotations

import ipaddress
import math
import re

from inagg.hostlib.wire.grant import parse_address

MAX_NAME_CHARS = 128            # a job's display name
MAX_TOKEN_CHARS = 256           # longer than any token we issue; refuses megabyte "tokens"
MAX_NONCE_CHARS = 64            # a launch nonce (hex; the library makes 32 characters)
MAX_HOSTNAME_CHARS = 253        # RFC 1035
MAX_STALL_CHARS = 512           # a worker's words on a stalled call (kept in logs and failures)
MAX_BYTES_PER_ITERATION = 1 << 50
MAX_ITERATION_SECONDS = 86400.0 * 365
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_MAC = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")


def check_text(what: str, text: str, limit: int) -> str:
    """Printable text of at most ``limit`` characters."""
    if len(text) > limit:
        raise ValueError(f"{what} is {len(text)} characters long; at most {limit} are allowed")
    if not text.isprintable():
        raise ValueError(f"{what} holds a control character (NUL, newline...): {text[:40]!r}")
    return text


def check_demand(n_workers: int, max_workers: int, bytes_per_iteration: int,
                 iteration_seconds: float) -> float:
    """The job's size and demand hint; returns the iteration time to use (0 means 1 s)."""
    if not 1 <= n_workers <= max_workers:
        raise ValueError(f"n_workers must be 1..{max_workers}, got {n_workers}")
    if not 0 <= bytes_per_iteration <= MAX_BYTES_PER_ITERATION:
        raise ValueError(f"bytes_per_iteration must be 0..{MAX_BYTES_PER_ITERATION}, "
                         f"got {bytes_per_iteration}")
    if iteration_seconds == 0:
        return 1.0
    if not math.isfinite(iteration_seconds) or not 0 < iteration_seconds <= MAX_ITERATION_SECONDS:
        raise ValueError(f"iteration_seconds must be a finite number in (0, {MAX_ITERATION_SECONDS:g}], "
                         f"got {iteration_seconds!r}")
    return iteration_seconds


def check_host(host: str) -> str:
    """An IPv4 address or an RFC 1123 hostname."""
    try:
        ipaddress.IPv4Address(host)
        return host
    except ValueError:
        pass
    check_text("host name", host, MAX_HOSTNAME_CHARS)
    labels = host.rstrip(".").split(".")
    if all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit():
        return host
    raise ValueError(f"bad host {host[:64]!r}: expected an IPv4 address or a host name")


def check_address(text: str) -> tuple[str, int]:
    """A worker's ``host:port`` (port 1..65535)."""
    check_text("address", text, MAX_HOSTNAME_CHARS + 6)
    host, port = parse_address(text)
    if port == 0:
        raise ValueError(f"bad address {text!r}: port 0")
    return check_host(host), port


def check_mac(text: str) -> str:
    """Empty, or six colon-separated hex bytes."""
    if text and not _MAC.match(text):
        raise ValueError(f"bad MAC {text[:40]!r}: expected xx:xx:xx:xx:xx:xx")
    return text
