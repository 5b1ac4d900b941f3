"""The batched form of FPM on NATS: several of one worker's payloads in one NATS message.

Subject: ``fpm.<ns>.<service>.<worker_id>.b`` (:func:`batch_subject`). The last token, where an unbatched
message has the DP rank, is ``b``: a worker's credentials already allow it (``fpm.<ns>.*.<its id>.*``,
:mod:`planner.transport.nats_config`) and nobody else's do, a shard's per-worker wildcard already receives it, and
it can never be mistaken for a rank's subject, so an unbatched message stays exactly what it was.

Frame (msgpack): ``[1, [rank, ...], [payload, ...]]`` -- the frame version, then the DP rank of each payload
(the index of the shim endpoint the relay read it from, as the rank token of an unbatched subject is) and the
payloads as ``bin``, each byte for byte the shim's ZMQ payload frame. Length-prefixed throughout, so one
unreadable payload never hides the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

from planner.transport.subjects import PREFIX, escape

__all__ = [
    "BATCH_TOKEN",
    "BATCH_VERSION",
    "FRAME_HEADER_BYTES",
    "BatchDecodeError",
    "batch_subject",
    "decode_batch",
    "encode_batch",
    "frame_overhead_bytes",
]

BATCH_TOKEN = "b"
BATCH_VERSION = 1
FRAME_HEADER_BYTES = 1 + 1 + 5 + 5  # array of 3, version, the two array headers

_encoder = msgspec.msgpack.Encoder()
_typed = msgspec.msgpack.Decoder(tuple[int, list[Annotated[int, msgspec.Meta(ge=0)]], list[bytes]])
_untyped = msgspec.msgpack.Decoder()


class BatchDecodeError(ValueError):
    """A batch frame that cannot be read at all (not msgpack, not the array, or another version)."""


def batch_subject(namespace: str, service: str, worker_id: str) -> str:
    """The subject ``worker_id``'s relay publishes its batches on."""
    return f"{PREFIX}.{escape(namespace)}.{escape(service)}.{escape(worker_id)}.{BATCH_TOKEN}"


def frame_overhead_bytes(payload_bytes: int) -> int:
    """An upper bound of what one payload adds to a frame beyond its own bytes (rank <= 2**32, bin header)."""
    return 5 + (2 if payload_bytes < 256 else 3 if payload_bytes < 65536 else 5)


def encode_batch(ranks: Sequence[int], payloads: Sequence[bytes]) -> bytes:
    """The frame of ``payloads`` read from ranks ``ranks`` (same length)."""
    if len(ranks) != len(payloads):
        raise ValueError(f"{len(ranks)} ranks for {len(payloads)} payloads")
    return _encoder.encode((BATCH_VERSION, ranks, payloads))


def decode_batch(frame: bytes) -> tuple[list[int], list[bytes], int]:
    """``(ranks, payloads, unreadable)``: the readable entries, and how many entries could not be read.

    Raises :class:`BatchDecodeError` when the frame itself cannot be read (its entries cannot be counted)."""
    try:
        version, ranks, payloads = _typed.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, MemoryError, ValueError, TypeError):
        return _decode_slowly(frame)
    if version != BATCH_VERSION:
        raise BatchDecodeError(f"unsupported FPM batch version {version} (this decoder reads {BATCH_VERSION})")
    if len(ranks) != len(payloads):
        n = min(len(ranks), len(payloads))
        return ranks[:n], payloads[:n], max(len(ranks), len(payloads)) - n
    return ranks, payloads, 0


def _decode_slowly(frame: bytes) -> tuple[list[int], list[bytes], int]:
    """The frame is readable msgpack but some entry is not a rank or a payload: keep the entries that are."""
    try:
        obj: Any = _untyped.decode(frame)
    except (msgspec.DecodeError, RecursionError, MemoryError, ValueError, TypeError) as exc:
        raise BatchDecodeError(f"not an FPM batch: {exc}") from exc
    if not isinstance(obj, list) or len(obj) != 3 or not isinstance(obj[1], list) or not isinstance(obj[2], list):
        raise BatchDecodeError("not an FPM batch: expected [version, [rank, ...], [payload, ...]]")
    if obj[0] != BATCH_VERSION or isinstance(obj[0], bool):
        raise BatchDecodeError(f"unsupported FPM batch version {obj[0]!r} (this decoder reads {BATCH_VERSION})")
    ranks: list[int] = []
    payloads: list[bytes] = []
    raw_ranks, raw_payloads = obj[1], obj[2]
    n = min(len(raw_ranks), len(raw_payloads))
    for rank, payload in zip(raw_ranks[:n], raw_payloads[:n], strict=True):
        if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 and isinstance(payload, bytes):
            ranks.append(rank)
            payloads.append(payload)
    return ranks, payloads, max(len(raw_ranks), len(raw_payloads)) - len(ranks)
