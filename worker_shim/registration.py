"""Registering a worker with the planner's discovery: the registration API (leases) or a static YAML file.

API contract (served by the planner service)::

    PUT    {api_url}/v1/workers/{worker_id}   Authorization: Bearer <token>
           {"role", "service", "dp_size", "fpm_endpoints": [one per rank], "capacity": {...}, "ttl_s"}
           -> 200 {"worker_id", "expires_at_s"}
    DELETE {api_url}/v1/workers/{worker_id}

The lease is renewed by PUT-ing again (the launcher does so every ``ttl_s / 3``). The static-file registrar keeps
the worker's entry in a file of the form :class:`planner.discovery.StaticFileDiscovery` reads, replacing the file
atomically (temporary file + rename, under an advisory lock) so a reader never sees half a file.

Errors: a refusal (HTTP 4xx) raises :class:`~planner.errors.LeaseError`; an unreachable server, a 5xx or an
unreadable file raises :class:`~planner.errors.DiscoveryError`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import msgspec
import yaml

from planner.discovery import WorkerRecord, parse_worker
from planner.errors import DiscoveryError, LeaseError

__all__ = ["ApiRegistrar", "Registrar", "StaticFileRegistrar", "registration_body"]


class Registrar(Protocol):
    """Where a worker announces itself."""

    def register(self, record: WorkerRecord) -> float | None:
        """Register or renew ``record``; returns the lease expiry (``expires_at_s``) when there is one."""
        ...

    def deregister(self, worker_id: str) -> None:
        """Remove the worker; a worker that is not registered is not an error."""
        ...


def registration_body(record: WorkerRecord, ttl_s: float) -> dict[str, Any]:
    """The JSON body of ``PUT /v1/workers/{worker_id}``."""
    return {
        "role": record.role.value,
        "service": record.service,
        "dp_size": record.dp_size,
        "fpm_endpoints": list(record.fpm_endpoints),
        "capacity": msgspec.to_builtins(record.capacity),
        "ttl_s": ttl_s,
    }


class _LeaseAnswer(msgspec.Struct, frozen=True):
    worker_id: str
    expires_at_s: float


class ApiRegistrar:
    """Client of the planner's registration API (blocking; call it from a thread in async code)."""

    def __init__(self, api_url: str, token: str, *, ttl_s: float = 30.0, timeout_s: float = 10.0) -> None:
        parsed = urllib.parse.urlparse(api_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise DiscoveryError(f"registration API URL must be http(s)://host[:port][/prefix], got {api_url!r}")
        if not ttl_s > 0:
            raise LeaseError(f"ttl_s must be > 0, got {ttl_s}")
        self.api_url = api_url.rstrip("/")
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._token = token

    def _url(self, worker_id: str) -> str:
        return f"{self.api_url}/v1/workers/{urllib.parse.quote(worker_id, safe='')}"

    def _call(self, method: str, worker_id: str, body: dict[str, Any] | None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._url(worker_id), data=data, method=method)
        request.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            message = f"{method} {self._url(worker_id)} answered {exc.code}: {detail}"
            if 400 <= exc.code < 500:
                raise LeaseError(message) from exc
            raise DiscoveryError(message) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise DiscoveryError(f"{method} {self._url(worker_id)} failed: {exc}") from exc

    def register(self, record: WorkerRecord) -> float:
        raw = self._call("PUT", record.worker_id, registration_body(record, self.ttl_s))
        try:
            answer = msgspec.json.decode(raw, type=_LeaseAnswer)
        except msgspec.DecodeError as exc:
            raise DiscoveryError(f"registration API answered an unreadable lease: {raw[:200]!r}") from exc
        if answer.worker_id != record.worker_id:
            raise LeaseError(f"registration API answered for worker {answer.worker_id!r}, not {record.worker_id!r}")
        return answer.expires_at_s

    def deregister(self, worker_id: str) -> None:
        try:
            self._call("DELETE", worker_id, None)
        except LeaseError as exc:
            if "answered 404" not in str(exc):
                raise


class StaticFileRegistrar:
    """Keeps this worker's entry in a ``workers:`` YAML file read by :class:`~planner.discovery.StaticFileDiscovery`.
    Other workers' entries are kept as they are."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(lock_path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        except OSError as exc:
            raise DiscoveryError(f"cannot lock workers file {self.path}: {exc}") from exc

    def _read(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise DiscoveryError(f"cannot read workers file {self.path}: {exc}") from exc
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise DiscoveryError(f"workers file {self.path} is not YAML (left untouched): {exc}") from exc
        if doc is None:
            return []
        if not isinstance(doc, dict) or not isinstance(doc.get("workers") or [], list):
            raise DiscoveryError(f"workers file {self.path}: expected a mapping with a 'workers' list (left untouched)")
        workers = list(doc.get("workers") or [])
        for i, item in enumerate(workers):
            if not isinstance(item, dict):
                raise DiscoveryError(f"workers file {self.path}: workers[{i}] is not a mapping (left untouched)")
        return workers

    def _write(self, workers: list[dict[str, Any]]) -> None:
        text = yaml.safe_dump({"workers": workers}, sort_keys=False)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise DiscoveryError(f"cannot write workers file {self.path}: {exc}") from exc

    def register(self, record: WorkerRecord) -> None:
        entry = {"worker_id": record.worker_id, **registration_body(record, 0.0)}
        del entry["ttl_s"]
        parse_worker(entry)  # what discovery will read back must validate
        with self._locked():
            workers = [w for w in self._read() if w.get("worker_id") != record.worker_id]
            workers.append(entry)
            self._write(workers)

    def deregister(self, worker_id: str) -> None:
        with self._locked():
            workers = self._read()
            kept = [w for w in workers if w.get("worker_id") != worker_id]
            if len(kept) != len(workers):
                self._write(kept)
