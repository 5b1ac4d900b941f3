"""NATS subjects for FPM: ``fpm.<namespace>.<service>.<worker_id>.<dp_rank>``.

A subject token may not hold ``.`` (the separator), ``*`` or ``>`` (wildcards) or whitespace, so every token is
escaped: those characters, ``%`` itself and anything outside printable ASCII become ``%XX`` (UTF-8 bytes, upper
case hex). The escape is injective and :func:`unescape` inverts it, so two distinct ids never share a subject and
a worker's publish permission (:mod:`planner.transport.nats_config`) covers exactly its own subjects.

The worker id in a subject is trusted only because the server enforced it: a worker's credentials may publish on
``fpm.<ns>.*.<its id>.*`` and nowhere else.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

__all__ = ["PREFIX", "escape", "namespace_wildcard", "parse", "subject", "unescape", "worker_wildcard"]

PREFIX = "fpm"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:+=@,;!~'()[]{}#$&^|/?<")


def escape(token: str) -> str:
    """``token`` made safe for one subject token; refuses an empty token (it would make an empty level)."""
    if not token:
        raise ValueError("a subject token must not be empty")
    if all(c in _SAFE for c in token):
        return token
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in token)


def unescape(token: str) -> str:
    """The inverse of :func:`escape`; raises ``ValueError`` for a token :func:`escape` cannot have made."""
    try:
        raw = unquote_to_bytes(token).decode() if "%" in token else token
    except UnicodeDecodeError as exc:
        raise ValueError(f"not an escaped subject token: {token!r}") from exc
    if not raw or escape(raw) != token:  # only the canonical form: one subject per id
        raise ValueError(f"not an escaped subject token: {token!r}")
    return raw


def subject(namespace: str, service: str, worker_id: str, dp_rank: int) -> str:
    """The subject rank ``dp_rank`` of ``worker_id`` publishes on."""
    if dp_rank < 0:
        raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
    return f"{PREFIX}.{escape(namespace)}.{escape(service)}.{escape(worker_id)}.{dp_rank}"


def worker_wildcard(namespace: str, worker_id: str) -> str:
    """Every subject of ``worker_id`` (any service, any rank): what its credentials may publish on."""
    return f"{PREFIX}.{escape(namespace)}.*.{escape(worker_id)}.*"


def namespace_wildcard(namespace: str) -> str:
    """Every FPM subject of ``namespace``: what one unsharded consumer subscribes to."""
    return f"{PREFIX}.{escape(namespace)}.>"


def parse(subj: str) -> tuple[str, str, str, int]:
    """``(namespace, service, worker_id, dp_rank)`` of an FPM subject; ``ValueError`` when it is not one."""
    tokens = subj.split(".")
    if len(tokens) != 5 or tokens[0] != PREFIX or not tokens[4].isdigit():
        raise ValueError(f"not an FPM subject: {subj!r}")
    return unescape(tokens[1]), unescape(tokens[2]), unescape(tokens[3]), int(tokens[4])
