"""Suite-wide rules. With FPM_NO_SKIPS=1 (set by `make test`, so by CI) a skipped test fails the run: every test
here exercises a real component that `make setup` installs, and a missing one must not pass silently."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fakes.tiny_vllm import FpmCollector, TinyEngine, write_tiny_llama
from tests.hypothesis_profiles import load_profile

SHARED_ENGINE_ID = "w-shared"

load_profile()  # HYPOTHESIS_PROFILE=stress: `make stress` (docs/testing.md); unset: Hypothesis's default


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("FPM_NO_SKIPS") != "1" or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        names = ", ".join(sorted({report.nodeid or str(report.location[0]) for report in skipped})[:10])
        reporter.write_line(f"FPM_NO_SKIPS=1: {len(skipped)} skipped test(s) fail this run: {names}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def shared_engine_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TinyEngine, FpmCollector]]:
    """One real vLLM CPU engine (tiny Llama, DP=1, the shim's scheduler, cold-started with an id, vLLM's own
    per-request stats on) for every test that only sends it requests and reads what it publishes: an engine start
    is the slowest thing in the suite. Take :func:`shared_engine`; a module-scoped fixture takes this one and waits
    for ``FpmCollector.idle`` itself."""
    pytest.importorskip("vllm")
    model = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-shared"))
    with (
        TinyEngine(model, worker_id=SHARED_ENGINE_ID, log_stats=True) as engine,
        FpmCollector(engine.endpoints) as collector,
    ):
        assert collector.wait_for(FpmCollector.idle, timeout_s=30), "no heartbeat from the shared engine"
        yield engine, collector


@pytest.fixture()
def shared_engine(shared_engine_session: tuple[TinyEngine, FpmCollector]) -> tuple[TinyEngine, FpmCollector]:
    """The shared engine, idle, its collector cleared."""
    engine, collector = shared_engine_session
    assert collector.wait_for(FpmCollector.idle, timeout_s=30), "the shared engine is still busy"
    collector.clear()
    return engine, collector
