"""Suite-wide rules. With FPM_NO_SKIPS=1 (set by `make test`, so by CI) a skipped test fails the run: every test
here exercises a real component that `make setup` installs, and a missing one must not pass silently."""

from __future__ import annotations

import os

import pytest

from tests.hypothesis_profiles import load_profile

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
