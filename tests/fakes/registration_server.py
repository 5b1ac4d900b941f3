"""A stand-in for the planner's registration API, on a real HTTP server (loopback, free port, own thread).

Speaks the contract of :mod:`worker_shim.registration`: ``PUT /v1/workers/{id}`` with a bearer token answers
``{"worker_id", "expires_at_s"}``, ``DELETE`` removes; a wrong token gets 401, a body that does not validate 422.
Every request is recorded (method, path, auth header, JSON body) for the test to inspect.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

__all__ = ["RecordedRequest", "RegistrationServer"]

_REQUIRED = ("role", "service", "dp_size", "fpm_endpoints", "capacity", "ttl_s")


class RecordedRequest(msgspec.Struct, frozen=True, kw_only=True):
    method: str
    path: str
    authorization: str
    body: Any
    at_s: float


class RegistrationServer:
    """``with RegistrationServer(token="t") as api: ... api.url ... api.requests ... api.workers``."""

    def __init__(self, token: str, *, fail_status: int | None = None) -> None:
        self.token = token
        self.fail_status = fail_status
        self.requests: list[RecordedRequest] = []
        self.workers: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                with owner._lock:
                    owner.requests.append(
                        RecordedRequest(
                            method=self.command,
                            path=self.path,
                            authorization=self.headers.get("Authorization", ""),
                            body=body,
                            at_s=time.monotonic(),
                        )
                    )
                if owner.fail_status is not None:
                    return self._answer(owner.fail_status, {"detail": "stand-in told to fail"})
                if self.headers.get("Authorization") != f"Bearer {owner.token}":
                    return self._answer(401, {"detail": "bad token"})
                prefix = "/v1/workers/"
                if not self.path.startswith(prefix) or len(self.path) == len(prefix):
                    return self._answer(404, {"detail": "no such route"})
                worker_id = urllib.parse.unquote(self.path[len(prefix) :])
                if self.command == "DELETE":
                    with owner._lock:
                        found = owner.workers.pop(worker_id, None)
                    return self._answer(200 if found else 404, {"worker_id": worker_id})
                if not isinstance(body, dict) or any(k not in body for k in _REQUIRED):
                    return self._answer(422, {"detail": f"body must have {list(_REQUIRED)}"})
                with owner._lock:
                    owner.workers[worker_id] = body
                return self._answer(200, {"worker_id": worker_id, "expires_at_s": time.time() + float(body["ttl_s"])})

            do_PUT = _handle
            do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="registration-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def methods(self) -> list[str]:
        with self._lock:
            return [r.method for r in self.requests]

    def __enter__(self) -> RegistrationServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
