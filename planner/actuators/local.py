"""The local actuator: scales a simulated fleet running in this process (``fpm-planner demo``, tests).

It is :class:`planner.sim.realtime.SimFleetActuator` (the simulator owns the fleet and its lock), offered here
under the actuators' naming so the service can build every actuator from one place. It implements
:class:`planner.actuators.base.Actuator`: ``status()`` reports desired / ready / starting replicas per service
(``{service_prefix}-{role}``), ``scale()`` sets a role's desired count (new replicas become ready after the
fleet's start-up delay; removed ones drain) and refuses counts outside ``[0, max_replicas]``.
"""

from __future__ import annotations

from planner.sim.realtime import SimFleetActuator as LocalActuator

__all__ = ["LocalActuator"]
