"""Mapping the official client's exceptions onto the planner's actuator error tree.

=============================== ===================================== =====================================
what the client raised          mapped to                             outcome kind
=============================== ===================================== =====================================
ApiException 404                :class:`NotFoundError`                ``not_found``
ApiException 403                :class:`ForbiddenError` (verb, res.)  ``forbidden``
ApiException 400 / 415 / 422    :class:`InvalidError`                 ``invalid``
ApiException 409                :class:`ConflictError`                ``conflict``
ApiException 429                :class:`ThrottledError` (Retry-After) ``throttled``
ApiException 5xx (and others)   :class:`ServerError`                  ``server_error``
urllib3 HTTPError / OSError     :class:`ApiTimeoutError`              ``timeout``
=============================== ===================================== =====================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from planner.actuators.base import (
    ActuatorError,
    ApiTimeoutError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    OutcomeKind,
    ServerError,
    ThrottledError,
)

__all__ = ["CLIENT_ERRORS", "http_status", "map_api_error", "outcome_kind", "parse_retry_after"]

# What a call through the official client can raise for reasons outside our code.
CLIENT_ERRORS: tuple[type[BaseException], ...] = (ApiException, urllib3.exceptions.HTTPError, OSError)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form); None when absent or unreadable."""
    if not headers:
        return None
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds)


def _server_message(exc: ApiException) -> str:
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            doc = json.loads(body)
        except json.JSONDecodeError:
            return body[:300]
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return str(doc["message"])
    return str(exc.reason or "")


def map_api_error(exc: BaseException, *, verb: str, resource: str, name: str = "") -> ActuatorError:
    """The planner error for a failed client call ``verb`` on ``resource`` (e.g. ``"update"``,
    ``"dynamographdeploymentscalingadapters/scale"``). Raise it ``from exc``."""
    what = f"{verb} {resource}" + (f" {name!r}" if name else "")
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        msg = _server_message(exc)
        if status == 404:
            return NotFoundError(f"{what}: not found ({msg})")
        if status == 403:
            return ForbiddenError(
                f"{what}: forbidden; the planner's service account needs verb {verb!r} on resource "
                f"{resource!r} ({msg})",
                verb=verb,
                resource=resource,
            )
        if status in (400, 415, 422):
            return InvalidError(f"{what}: rejected by the API server ({status}: {msg})")
        if status == 409:
            return ConflictError(f"{what}: conflict ({msg})")
        if status == 429:
            retry_after = parse_retry_after(exc.headers)
            return ThrottledError(
                f"{what}: throttled (429{'' if retry_after is None else f', Retry-After {retry_after:g}s'})",
                retry_after_s=retry_after,
            )
        return ServerError(f"{what}: API server error {status}: {msg}")
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return ApiTimeoutError(f"{what}: no answer from the API server ({type(exc).__name__}: {exc})")
    return ServerError(f"{what}: unexpected {type(exc).__name__}: {exc}")


_KINDS: tuple[tuple[type[ActuatorError], OutcomeKind], ...] = (
    (NotFoundError, OutcomeKind.NOT_FOUND),
    (ForbiddenError, OutcomeKind.FORBIDDEN),
    (InvalidError, OutcomeKind.INVALID),
    (ConflictError, OutcomeKind.CONFLICT),
    (ThrottledError, OutcomeKind.THROTTLED),
    (ApiTimeoutError, OutcomeKind.TIMEOUT),
)


def outcome_kind(err: ActuatorError) -> OutcomeKind:
    for cls, kind in _KINDS:
        if isinstance(err, cls):
            return kind
    return OutcomeKind.SERVER_ERROR


def http_status(exc: BaseException) -> int | None:
    return int(exc.status) if isinstance(exc, ApiException) and exc.status is not None else None
