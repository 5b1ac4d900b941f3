"""The local actuator: scales a simulated fleet running in this process (``fpm-planner demo``, tests).

It is :class:`planner.sim.realtime.SimFleetActuator` (the simulator owns the fleet and its lock), offered here
under the actuators' naming so the service can build every actuator from one place. It implements
:class:`planner.actuators.base.Actuator`: ``status()`` reports desired / ready / starting replicas per service
(``{service_prefix}-{role}``), ``scale()`` sets a role's desired count (new replicas become ready after the
fleet's start-up delay; removed ones drain) and refuses counts outside ``[0, max_replicas]``, and — under the
fleet's lock, so nothing changes between the comparison and the write — a request whose ``expected_replicas``
is not the role's desired count (``CURRENT_MISMATCH``).
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.actuators.base import ReplicaBounds, ScaleOutcome, ScaleRequest, check_expected
from planner.sim.realtime import SimFleetActuator

__all__ = ["LocalActuator"]


class LocalActuator(SimFleetActuator):
    def replica_bounds(self) -> Mapping[str, ReplicaBounds]:
        fleet = self.replay.fleet
        bound = ReplicaBounds(min_replicas=0, max_replicas=self.max_replicas)
        return {fleet.service_name(role): bound for role in fleet.config.roles}

    def scale(self, request: ScaleRequest) -> ScaleOutcome:
        role = self._role(request.service)
        with self.replay.lock:  # re-entrant: the write below takes it again
            mismatch = check_expected(request, self.replay.fleet.desired(role), f"sim/{request.service}")
            if mismatch is not None:
                return mismatch
            return super().scale(request)
