"""Optional ZMQ CURVE on the FPM link: encryption, and authentication of both ends.

The publisher (it binds) is the CURVE **server**: its keypair comes from a secret-key certificate file (a
Kubernetes Secret mounts as one), made with ``zmq.auth.create_certificates`` or ``curve_keygen``. The planner's
subscriber is a CURVE **client**: it must know the server's public key (one per worker, or one fleet-wide key)
and has a keypair of its own (from a file, or drawn at start). A SUB without the server's public key completes no
handshake and reads nothing. The publisher may also restrict which clients may connect: a directory of the
allowed clients' public-key certificates, checked by a ZAP handler (``zmq.auth.thread.ThreadAuthenticator``).

Key files are read with ``zmq.auth.load_certificate``; a file that is missing or lacks the key needed raises
:class:`CurveKeyError` naming it.
"""

from __future__ import annotations

import os

import msgspec
import zmq
import zmq.auth

__all__ = ["CurveClientKeys", "CurveKeyError", "CurveServerKeys", "load_public_key", "load_secret_keypair"]


class CurveKeyError(ValueError):
    """A CURVE key file that cannot be used (missing, unreadable, or without the key needed)."""


def load_secret_keypair(path: str) -> tuple[bytes, bytes]:
    """``(public, secret)`` Z85 keys from a secret-key certificate file."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveKeyError(f"cannot read the CURVE certificate {path}: {exc}") from exc
    if not secret:
        raise CurveKeyError(f"{path} holds no secret key (use the '.key_secret' certificate)")
    return public, secret


def load_public_key(path: str) -> bytes:
    """The Z85 public key of a certificate file (public or secret)."""
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveKeyError(f"cannot read the CURVE certificate {path}: {exc}") from exc
    return public


class CurveServerKeys(msgspec.Struct, frozen=True, kw_only=True):
    """The publisher's side: its keypair, and optionally the only clients it accepts."""

    public_key: bytes
    secret_key: bytes
    allowed_clients_dir: str | None = None  # public-key certificates of the clients let in; None: any client

    @classmethod
    def from_files(cls, secret_key_file: str, allowed_clients_dir: str | None = None) -> CurveServerKeys:
        public, secret = load_secret_keypair(secret_key_file)
        if allowed_clients_dir is not None and not os.path.isdir(allowed_clients_dir):
            raise CurveKeyError(f"the allowed CURVE clients directory {allowed_clients_dir} does not exist")
        return cls(public_key=public, secret_key=secret, allowed_clients_dir=allowed_clients_dir)

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` a CURVE server (before it binds)."""
        sock.curve_secretkey = self.secret_key
        sock.curve_publickey = self.public_key
        sock.curve_server = True


class CurveClientKeys(msgspec.Struct, frozen=True, kw_only=True):
    """The subscriber's side: the server's public key and the client's own keypair."""

    server_public_key: bytes
    public_key: bytes
    secret_key: bytes

    @classmethod
    def from_files(cls, server_public_key_file: str, client_secret_key_file: str | None = None) -> CurveClientKeys:
        """``client_secret_key_file`` None: a keypair drawn now (enough when the publishers admit any client)."""
        server = load_public_key(server_public_key_file)
        if client_secret_key_file is None:
            public, secret = zmq.curve_keypair()
        else:
            public, secret = load_secret_keypair(client_secret_key_file)
        return cls(server_public_key=server, public_key=public, secret_key=secret)

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` a CURVE client of the server (before it connects)."""
        sock.curve_serverkey = self.server_public_key
        sock.curve_publickey = self.public_key
        sock.curve_secretkey = self.secret_key
