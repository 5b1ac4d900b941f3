"""Which transport feeds the planner's FleetStore: ``zmq`` (direct, one SUB socket per discovered endpoint; the
embedded default) or ``nats`` (:class:`~planner.transport.nats_source.NatsFpmSource`), and the NATS settings.

:class:`IngestSource` is what the service reads of either (the store, its lock, a snapshot, discovery changes,
start/close, counters); :func:`make_ingest_source` builds the one the configuration names. The password is read
from a file (a mounted Secret), never from the configuration itself.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import msgspec

from planner.discovery import WorkerRecord
from planner.errors import ConfigError
from planner.ingest.store import FleetSnapshot, FleetStore
from planner.ingest.subscriber import FpmSubscriber, LinkStats, LinkTotals
from planner.transport.nats_source import NatsFpmSource
from worker_shim.curve import CurveClientKeys

__all__ = ["IngestSource", "NatsSettings", "Transport", "make_ingest_source"]


class Transport(enum.StrEnum):
    ZMQ = "zmq"
    NATS = "nats"


class NatsSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    namespace: str = "default"  # the <ns> of fpm.<ns>.<service>.<worker>.<rank>
    user: str | None = None
    password_file: str | None = None

    def password(self) -> str | None:
        """The password ``password_file`` holds (None without one); :class:`ConfigError` when it cannot be read."""
        if self.password_file is None:
            return None
        try:
            return Path(self.password_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"ingest.nats.password_file {self.password_file!r}: {exc}") from exc


class IngestSource(Protocol):
    """What the service uses of an ingest source, ZMQ or NATS."""

    store: FleetStore
    lock: threading.Lock
    received: int
    loop_errors: int

    def set_workers(self, workers: Mapping[str, WorkerRecord]) -> None: ...

    @property
    def endpoints(self) -> tuple[str, ...]: ...

    def snapshot(self, now: float) -> FleetSnapshot: ...

    def start(self) -> object: ...

    def close(self) -> None: ...

    def link_totals(self) -> LinkTotals: ...

    def links(self) -> dict[str, LinkStats]: ...

    def troubled_links(self, limit: int = 50) -> list[LinkStats]: ...


def make_ingest_source(
    store: FleetStore,
    transport: Transport,
    nats: NatsSettings,
    *,
    max_msg_bytes: int,
    curve: CurveClientKeys | None = None,
    round_interval_s: float = 0.1,
) -> IngestSource:
    """The source ``transport`` names (``curve``: the ZMQ path's CURVE keys; NATS authenticates by user;
    ``round_interval_s``: the ZMQ subscriber's shortest time between receive rounds); raises
    :class:`ConfigError` for NATS settings that cannot work."""
    if transport is Transport.ZMQ:
        return FpmSubscriber(store, max_msg_bytes=max_msg_bytes, curve=curve, min_poll_interval_s=round_interval_s)
    if not nats.servers or not nats.namespace:
        raise ConfigError("ingest.nats: servers and namespace must not be empty with transport: nats")
    return NatsFpmSource(
        store, servers=nats.servers, namespace=nats.namespace, user=nats.user, password=nats.password()
    )
