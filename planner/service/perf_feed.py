"""The perf-model feed: one online :class:`~perf_model.model.PerfModel` per role, fed from the FleetStore.

:class:`PerfFeed` is handed the store, the lock that guards it and the current workers by the runner each
tick (:meth:`PerfFeed.feed`); in sharded mode the leader hands it the shards' training points instead
(:meth:`PerfFeed.observe`). It reads no clock (``now`` arrives as an argument) and never imports the runner.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from perf_model.api import PerfPredictor
from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role, WorkerRecord
from planner.errors import ConfigError, PlannerError
from planner.ingest.store import FleetStore
from planner.service.config import PerfModelSettings
from worker_shim.fpm import ForwardPassMetrics

__all__ = ["PerfFeed", "perf_brief"]

log = logging.getLogger(__name__)


class PerfFeed:
    """The per-role perf models, what the core may predict with (``predictors``) and the last model error."""

    def __init__(self, settings: PerfModelSettings) -> None:
        self.settings = settings
        self.models: dict[Role, PerfModel] = {}
        if settings.enabled:
            bootstrap = None
            if settings.profile_dir is not None:
                try:
                    bootstrap = ProfileStepTimer.from_dir(settings.profile_dir)
                except (PlannerError, OSError, ValueError) as exc:
                    raise ConfigError(f"perf_model.profile_dir: {exc}") from exc
            self.models = {role: PerfModel(role, bootstrap=bootstrap) for role in Role}
        self.predictors: dict[Role, PerfPredictor] | None = dict(self.models) or None
        self.error: str | None = None
        self._fed_at: dict[tuple[str, int], float] = {}

    def feed(
        self, store: FleetStore, lock: threading.Lock | threading.RLock, workers: Mapping[str, WorkerRecord], now: float
    ) -> None:
        """Offer the perf models the step samples stored since the last tick — at most
        ``perf_model.max_samples_per_tick``, the newest of every rank in equal shares (a model keeps a bounded,
        load-binned store; a large fleet produces far more samples than it needs) — then refit on their cadence.
        A model that fails is reported in diagnostics and left out of this tick (threshold mode)."""
        if not self.models:
            return
        fresh: dict[Role, list[ForwardPassMetrics]] = {}
        with lock:
            pending = []
            for key, window in store.iter_windows():
                record = workers.get(key[0])
                if record is not None and window and window[-1][0] > self._fed_at.get(key, -1.0):
                    pending.append((key, record.role, window))
            share = max(1, self.settings.max_samples_per_tick // max(1, len(pending)))
            for key, role, window in pending:
                since = self._fed_at.get(key, -1.0)
                newest: list[ForwardPassMetrics] = []
                for at, sample in reversed(window):
                    if at <= since or len(newest) >= share:
                        break
                    newest.append(sample)
                fresh.setdefault(role, []).extend(reversed(newest))  # in publishing order, as the model expects
                self._fed_at[key] = window[-1][0]
        for key in [k for k in self._fed_at if k[0] not in workers]:
            del self._fed_at[key]
        self.observe(fresh, now)

    def observe(self, fresh: Mapping[Role, Sequence[ForwardPassMetrics]], now: float) -> None:
        """Offer the models ``fresh`` (per role, in publishing order per rank), then refit on their cadence: what
        :meth:`feed` does with the store's samples, and the sharded leader with the shards' training points
        (:mod:`planner.shard.perf_points`). A model that fails is reported in diagnostics and left out of this
        tick (threshold mode)."""
        if not self.models:
            return
        try:
            for role, samples in fresh.items():
                self.models[role].observe_many(samples, now)
            for model in self.models.values():
                model.maybe_refit(now)
        except Exception as exc:  # a model bug must not stop the planner deciding
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("perf model update failed; deciding without it")
            self.predictors = None
            return
        self.error = None
        self.predictors = dict(self.models)

    def brief(self) -> dict[str, Any]:
        return {
            "enabled": bool(self.models),
            "error": self.error,
            "roles": {role.value: perf_brief(model) for role, model in self.models.items()},
        }


def perf_brief(model: PerfModel) -> dict[str, Any]:
    status = model.status()
    return {
        "source": status.source.value,
        "ready": status.ready,
        "live_ready": status.live_ready,
        "not_ready_because": list(status.not_ready_because),
        "samples": status.samples,
        "offered": sum(status.verdicts.values()),
        "accepted": status.accepted,
        "fits": status.fits,
    }
