"""Errors raised by perf_model, inside the planner's :class:`~planner.errors.PlannerError` tree::

PlannerError
├── ConfigError
│   └── ProfileError          a measured-profile directory that is missing or does not validate
├── ModelNotReadyError        a prediction asked of a model that has neither live data nor a bootstrap
└── InvalidLoadError          a load no engine can have (negative, NaN, infinite), also a ValueError
"""

from __future__ import annotations

from planner.errors import ConfigError, PlannerError

__all__ = ["InvalidLoadError", "ModelNotReadyError", "ProfileError"]


class ProfileError(ConfigError):
    """A measured profile that cannot be read; the message names the file, the row and the field."""


class ModelNotReadyError(PlannerError):
    """The model has not seen enough samples spanning enough of the load range and has no bootstrap profile:
    it refuses to guess. The message says what is missing."""


class InvalidLoadError(PlannerError, ValueError):
    """A load given to a step-time or latency function that no engine can have (negative, NaN, infinite)."""
