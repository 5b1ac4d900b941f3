"""Durable runtime state: bounds set at run time, pause, registrations, and the audit log of their changes.

The state is one JSON document (:class:`RuntimeState`) kept by a backend:

* :class:`ConfigMapBackend` (in Kubernetes): the ``state.json`` key of a ConfigMap. Writes are a ``PUT`` with
  the ``metadata.resourceVersion`` read (optimistic concurrency); a 409 means another planner replica wrote
  first, so the change is re-applied to what it wrote and retried. A ConfigMap rather than the leader Lease's
  annotations: a Lease is rewritten every renewal by whoever holds it (every write would race the renewals)
  and its RBAC is shared with leader election; a ConfigMap has its own resource name and verbs.
* :class:`FileBackend` (outside Kubernetes): a local file written atomically (write a temporary file in the
  same directory, fsync it, rename it over the old one, fsync the directory), read-modify-write under an
  exclusive ``flock`` so that two planners on one host serialize.

:class:`StateStore` applies one change at a time: ``set(section, key, value, who=...)`` reads, changes one
entry, appends an :class:`AuditRecord` (who = the credential's *name*, never the token; when; what; from ->
to) to a bounded log (oldest dropped first) and writes, retrying on conflict. It logs each record. The clock is
handed in; nothing here reads the environment.

Errors: :class:`StateStoreError` (a :class:`~planner.errors.PlannerError`) when the backend cannot be read or
written, or when a conflict persists past ``max_attempts``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import msgspec
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from planner.errors import PlannerError
from planner.k8s.errors import CLIENT_ERRORS

__all__ = [
    "SECTIONS",
    "AuditRecord",
    "ConfigMapBackend",
    "FileBackend",
    "MemoryBackend",
    "RuntimeState",
    "StateBackend",
    "StateConflictError",
    "StateStore",
    "StateStoreError",
]

log = logging.getLogger("planner.audit")

SECTIONS = ("bounds", "pause", "registrations", "settings")
DATA_KEY = "state.json"


class StateStoreError(PlannerError):
    """The runtime state cannot be read or written."""


class StateConflictError(StateStoreError):
    """Someone else wrote the state since it was read (retry on a fresh read)."""


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    at_s: float
    who: str  # the credential's name
    action: str  # e.g. "set bounds", "pause", "register"
    section: str
    key: str
    before: Any = None  # JSON value; None: absent
    after: Any = None


class RuntimeState(msgspec.Struct, frozen=True, kw_only=True):
    """What must survive a restart and a failover. Each section maps a key (a service, a worker id, ``"*"``
    for all) to a JSON value."""

    bounds: dict[str, Any] = msgspec.field(default_factory=dict)
    pause: dict[str, Any] = msgspec.field(default_factory=dict)
    registrations: dict[str, Any] = msgspec.field(default_factory=dict)
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    audit: tuple[AuditRecord, ...] = ()
    generation: int = 0  # bumped by every write

    def section(self, name: str) -> dict[str, Any]:
        if name not in SECTIONS:
            raise StateStoreError(f"unknown state section {name!r} (one of {', '.join(SECTIONS)})")
        value: dict[str, Any] = getattr(self, name)
        return value


_DECODER = msgspec.json.Decoder(RuntimeState)


def decode_state(raw: bytes | str | None, where: str) -> RuntimeState:
    if raw is None or raw in (b"", ""):
        return RuntimeState()
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise StateStoreError(f"runtime state in {where} is not valid: {exc}") from exc


class StateBackend(Protocol):
    """Reads return the state and an opaque version; a write with a stale version raises
    :class:`StateConflictError`."""

    def read(self) -> tuple[RuntimeState, str | None]: ...

    def write(self, state: RuntimeState, version: str | None) -> str: ...

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]: ...


class FileBackend:
    """A local JSON file written atomically (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateStoreError(f"cannot open the state lock {self._lock_path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def read(self) -> tuple[RuntimeState, str | None]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return RuntimeState(), None
        except OSError as exc:
            raise StateStoreError(f"cannot read the state file {self.path}: {exc}") from exc
        state = decode_state(raw, str(self.path))
        return state, str(state.generation)

    def write(self, state: RuntimeState, version: str | None) -> str:
        _, current = self.read()
        if current != version:
            raise StateConflictError(f"{self.path} changed since it was read (generation {current} != {version})")
        data = msgspec.json.encode(state)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise StateStoreError(f"cannot write the state file {self.path}: {exc}") from exc
        return str(state.generation)


class MemoryBackend:
    """State in this process only (no durability): when neither a file nor a ConfigMap is configured."""

    def __init__(self) -> None:
        self._state = RuntimeState()
        self._lock = threading.Lock()  # the tick and the API change it from different threads

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._lock:
            yield

    def read(self) -> tuple[RuntimeState, str | None]:
        return self._state, str(self._state.generation)

    def write(self, state: RuntimeState, version: str | None) -> str:
        if version != str(self._state.generation):
            raise StateConflictError("in-memory state changed since it was read")
        self._state = state
        return str(state.generation)


class ConfigMapBackend:
    """The ``state.json`` key of a ConfigMap, written with its resourceVersion as a precondition."""

    def __init__(self, api: k8s.ApiClient, namespace: str, name: str) -> None:
        self._core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.name = name

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield  # the resourceVersion precondition is the concurrency control

    def _where(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    def read(self) -> tuple[RuntimeState, str | None]:
        try:
            cm = self._core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return RuntimeState(), None
            raise StateStoreError(f"cannot read {self._where()}: {exc.status} {exc.reason}") from exc
        except CLIENT_ERRORS as exc:
            raise StateStoreError(f"cannot read {self._where()}: {exc}") from exc
        version = cm.metadata.resource_version if cm.metadata is not None else None
        return decode_state((cm.data or {}).get(DATA_KEY), self._where()), version

    def write(self, state: RuntimeState, version: str | None) -> str:
        body = k8s.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=k8s.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                labels={"app.kubernetes.io/component": "fpm-planner-state"},
                resource_version=version,
            ),
            data={DATA_KEY: msgspec.json.encode(state).decode()},
        )
        try:
            if version is None:
                out = self._core.create_namespaced_config_map(self.namespace, body)
            else:
                out = self._core.replace_namespaced_config_map(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                raise StateConflictError(f"{self._where()} changed since it was read") from exc
            raise StateStoreError(f"cannot write {self._where()}: {exc.status} {exc.reason}") from exc
        except CLIENT_ERRORS as exc:
            raise StateStoreError(f"cannot write {self._where()}: {exc}") from exc
        return str(out.metadata.resource_version if out.metadata is not None else "")


class StateStore:
    """One change at a time, audited (see the module docstring)."""

    def __init__(
        self,
        backend: StateBackend,
        clock: Callable[[], float],
        *,
        audit_limit: int = 500,
        max_attempts: int = 5,
    ) -> None:
        if audit_limit < 1 or max_attempts < 1:
            raise ValueError("audit_limit and max_attempts must be >= 1")
        self.backend = backend
        self.clock = clock
        self.audit_limit = audit_limit
        self.max_attempts = max_attempts
        self._state = RuntimeState()

    @property
    def state(self) -> RuntimeState:
        """The state as last read or written by this store."""
        return self._state

    def load(self) -> RuntimeState:
        """Read the stored state (at start, and when this replica becomes the leader)."""
        self._state, _ = self.backend.read()
        return self._state

    def set(self, section: str, key: str, value: Any, *, who: str, action: str) -> AuditRecord | None:
        """Set ``section[key]`` to ``value`` (a JSON value; None removes the key), as ``who`` (a credential
        name). Returns the audit record, or None when nothing changed (nothing is written then)."""
        RuntimeState().section(section)  # validates the name
        if not who:
            raise StateStoreError("a change needs the name of who made it")
        value = json.loads(json.dumps(value)) if value is not None else None  # JSON only, copied
        for _ in range(self.max_attempts):
            with self.backend.exclusive():
                state, version = self.backend.read()
                before = state.section(section).get(key)
                if before == value:
                    self._state = state
                    return None
                entries = dict(state.section(section))
                if value is None:
                    entries.pop(key, None)
                else:
                    entries[key] = value
                record = AuditRecord(
                    at_s=self.clock(), who=who, action=action, section=section, key=key, before=before, after=value
                )
                audit = (*state.audit, record)[-self.audit_limit :]
                new = msgspec.structs.replace(state, **{section: entries}, audit=audit, generation=state.generation + 1)
                try:
                    self.backend.write(new, version)
                except StateConflictError:
                    continue
                self._state = new
                log.info(
                    "audit %s",
                    json.dumps(msgspec.to_builtins(record), separators=(",", ":"), sort_keys=True),
                )
                return record
        raise StateStoreError(f"state write of {section}/{key} still conflicting after {self.max_attempts} attempts")

    def audit(self, limit: int | None = None) -> tuple[AuditRecord, ...]:
        """The audit log, newest last (``limit``: only the newest ``limit``)."""
        records = self._state.audit
        return records if limit is None else records[-limit:] if limit > 0 else ()
