"""Running the decision core off the event loop, with a deadline.

:class:`OffLoop` runs a (pure, CPU-bound) function in a daemon thread of its own and awaits it for at most
``deadline_s``: a call that misses it raises :class:`DeadlineMissed` while the thread runs on (a Python thread
cannot be stopped; its result is thrown away when it ends). An answer that arrives after the deadline (by the
``clock`` it is handed) is a miss too, so what is acted on was always computed within the deadline. At most
``slots`` calls run at once: one more raises :class:`Busy` at once, so a stuck computation never stacks another
on top of it. The threads are daemons, so a stuck one never holds up the process's exit (SIGTERM still stops
the service).

Errors::

    PlannerError
    └── OffLoopError
        ├── DeadlineMissed   the call did not finish within its deadline (it may still be running)
        └── Busy             every slot is taken by a call still running

:class:`TickHold` names why a tick held without deciding (documented in docs/reasons.md).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from planner.errors import PlannerError

__all__ = ["Busy", "DeadlineMissed", "OffLoop", "OffLoopError", "TickGuard", "TickHold"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_MISSED: Any = object()


class TickHold(enum.StrEnum):
    DECIDE_DEADLINE_MISSED = "decide_deadline_missed"  # the core did not decide within tick_deadline_s
    DECIDE_STILL_RUNNING = "decide_still_running"  # an earlier tick's core step has not ended: none stacked


class OffLoopError(PlannerError):
    """A call run off the event loop did not give an answer."""


class DeadlineMissed(OffLoopError):
    """The call did not finish within its deadline; it may still be running in its thread."""


class Busy(OffLoopError):
    """Every slot is taken by a call still running."""


class OffLoop:
    def __init__(self, name: str, *, clock: Callable[[], float], slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.name = name
        self._clock = clock
        self.slots = slots
        self._lock = threading.Lock()
        self._running = 0
        self.missed = 0  # calls that missed their deadline
        self.refused = 0  # calls refused as Busy

    @property
    def running(self) -> int:
        """Calls whose thread has not ended (those that missed their deadline included)."""
        with self._lock:
            return self._running

    async def run(self, fn: Callable[..., T], *args: Any, deadline_s: float) -> T:
        """``fn(*args)`` in a daemon thread; its result, or DeadlineMissed after ``deadline_s``, or Busy."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        future.add_done_callback(_consume)  # an answer arriving after the deadline is dropped quietly
        with self._lock:
            if self._running >= self.slots:
                self.refused += 1
                raise Busy(f"{self.name}: {self._running} call(s) still running (at most {self.slots})")
            self._running += 1

        def work() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting side, whatever it is
                error = exc
            with self._lock:  # the slot is free before the answer is handed over
                self._running -= 1
            _hand(loop, future, result, error)

        started = self._clock()
        threading.Thread(target=work, name=f"{self.name}-worker", daemon=True).start()
        try:
            result = await asyncio.wait_for(asyncio.shield(future), timeout=deadline_s)
        except TimeoutError:
            result = _MISSED
        if result is _MISSED or self._clock() - started > deadline_s:
            with self._lock:
                self.missed += 1
            raise DeadlineMissed(f"{self.name}: no answer within {deadline_s:g} s")
        return result


class TickGuard:
    """The tick's core step off the loop with its deadline, the holds it caused (by reason, the last one with its
    detail; logged once per spell) and whether ticks decide (:meth:`ticking`, what the Lease elector's health
    check reads). Handed the runner's clocks; it never imports the runner."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        deadline_s: float,
        stale_after_s: float,
    ) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self.deadline_s = deadline_s
        self.stale_after_s = stale_after_s
        self.off_loop = OffLoop("planner-decide", clock=clock, slots=1)
        self.started_at = clock()
        self.last_good_at: float | None = None  # monotonic: the last tick whose core step answered in time
        self.last_hold: dict[str, Any] | None = None  # the last tick held without deciding: reason, detail, at_s
        self.holds: dict[str, int] = {}  # by TickHold
        self._holding: str | None = None  # the reason of the current spell of holds

    async def decide(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)`` off the loop within the deadline; None (a hold, recorded) when it misses the deadline or
        an earlier step is still running (none is stacked on it)."""
        if self.off_loop.running:
            self._hold(TickHold.DECIDE_STILL_RUNNING, "the core step of an earlier tick has not ended; none stacked")
            return None
        try:
            result = await self.off_loop.run(fn, *args, deadline_s=self.deadline_s)
        except DeadlineMissed as exc:
            self._hold(TickHold.DECIDE_DEADLINE_MISSED, f"{exc} (tick_deadline_s): nothing decided, nothing sent")
            return None
        self.last_good_at = self._clock()
        self._holding = None
        return result

    def _hold(self, reason: TickHold, detail: str) -> None:
        self.holds[reason.value] = self.holds.get(reason.value, 0) + 1
        self.last_hold = {"reason": reason.value, "detail": detail, "at_s": self._wall_clock()}
        if self._holding != reason.value:
            log.warning("tick held (%s): %s", reason.value, detail)
            self._holding = reason.value

    def ticking(self) -> bool:
        """Whether a core step answered within ``stale_after_s`` (the start counts as one)."""
        last = self.last_good_at if self.last_good_at is not None else self.started_at
        return self._clock() - last < self.stale_after_s


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _hand(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    def settle() -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop has closed: nobody waits any more
        pass
