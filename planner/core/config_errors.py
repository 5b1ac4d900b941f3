"""The decision core's configuration error and the two checks every config struct validates with."""

from __future__ import annotations

import math

from planner.errors import ConfigError

__all__ = ["CoreConfigError", "finite_nonneg", "need"]


class CoreConfigError(ConfigError, ValueError):
    """A decision-core setting that does not validate. Also a ``ValueError`` so that msgspec, while decoding,
    turns it into a ``ValidationError`` carrying the field path."""


def need(ok: bool, message: str) -> None:
    if not ok:
        raise CoreConfigError(message)


def finite_nonneg(name: str, value: float) -> None:
    need(math.isfinite(value) and value >= 0, f"{name} must be a finite number >= 0, got {value!r}")
