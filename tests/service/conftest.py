"""Fixtures of the service tests: a planner service on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.service.support import Served, make_config, serve


@pytest.fixture()
def service() -> Iterator[Served]:
    with serve(make_config()) as served:
        yield served
