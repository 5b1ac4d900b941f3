"""The planner's exception tree.

::

    PlannerError
    ├── ConfigError            configuration or input file that does not validate (message names the field)
    ├── DiscoveryError         a discovery source that cannot be read
    │   └── LeaseError         register/renew/deregister refused (unknown worker, bad lease)
    └── ActuatorError          a scale request that did not take effect (see planner.actuators)
"""

from __future__ import annotations

__all__ = ["ActuatorError", "ConfigError", "DiscoveryError", "LeaseError", "PlannerError"]


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""


class ConfigError(PlannerError):
    """Configuration that does not validate; the message names the offending field."""


class DiscoveryError(PlannerError):
    """A discovery source that cannot be read or parsed."""


class LeaseError(DiscoveryError):
    """A registration, renewal or deregistration that the registry refuses."""


class ActuatorError(PlannerError):
    """A scale request that did not take effect."""
