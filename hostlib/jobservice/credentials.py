"""Where secrets and transport security come from: tokens from a file or the environment (never
from argv, which every local user can read in /proc), and the job service's channel: TLS on TCP,
plaintext only on a Unix socket or when explicitly asked for (docs/security.md)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

ADMIN_TOKEN_ENV = "INAGG_ADMIN_TOKEN"
ADMIN_TOKEN_FILE_ENV = "INAGG_ADMIN_TOKEN_FILE"  # inaggctl: a file holding it (an emulation run sets it)
CA_ENV = "INAGG_CONTROLLER_CA"              # PEM file of the CA the controller's certificate is from
TLS_NAME_ENV = "INAGG_CONTROLLER_TLS_NAME"  # the name in that certificate, when not the address's host
INSECURE_ENV = "INAGG_CONTROLLER_INSECURE"  # "1": plaintext TCP (tokens readable on the wire)


def load_token(path: str | Path | None, env: str = ADMIN_TOKEN_ENV) -> str:
    """The token in file ``path`` (surrounding whitespace stripped), else in environment
    variable ``env``, else ""."""
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as e:
            raise ValueError(f"cannot read token file {path}: {e}") from None
    return os.environ.get(env, "")


def write_token(path: str | Path, token: str) -> None:
    """Write ``token`` to a file only its owner can read (created so from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def is_unix(address: str) -> bool:
    return address.startswith("unix:")


def open_channel(address: str, ca: str | Path | None = None, insecure: bool | None = None,
                 options: list | None = None) -> grpc.Channel:
    """A channel to the job service at ``address``: plaintext on a Unix socket; on TCP, TLS
    verified against ``ca`` (default: $INAGG_CONTROLLER_CA), or plaintext when ``insecure``
    (default: $INAGG_CONTROLLER_INSECURE=1); ValueError when TCP has neither."""
    ca = ca or os.environ.get(CA_ENV)
    insecure = os.environ.get(INSECURE_ENV) == "1" if insecure is None else insecure
    if is_unix(address) or (insecure and not ca):
        return grpc.insecure_channel(address, options=options)
    if not ca:
        raise ValueError(f"controller at {address}: TCP needs TLS: give the CA certificate "
                         f"(--controller-ca or ${CA_ENV}), or ask for plaintext explicitly "
                         f"(${INSECURE_ENV}=1)")
    try:
        root = Path(ca).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read CA certificate {ca}: {e}") from None
    options = list(options or [])
    if os.environ.get(TLS_NAME_ENV):
        options.append(("grpc.ssl_target_name_override", os.environ[TLS_NAME_ENV]))
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=root), options=options)


def server_credentials(cert: str | Path, key: str | Path) -> grpc.ServerCredentials:
    """TLS credentials of the job service from PEM files."""
    try:
        pair = (Path(key).read_bytes(), Path(cert).read_bytes())
    except OSError as e:
        raise ValueError(f"cannot read the TLS certificate or key: {e}") from None
    return grpc.ssl_server_credentials([pair])
