"""planner.k8s.setup: the service's builder for pod discovery and the Lease elector."""

from __future__ import annotations

from typing import Any

import pytest

from planner.errors import ConfigError
from planner.k8s.setup import build_kubernetes
from tests.fakes.k8s_api import K8sApiEmulator
from tests.k8s.k8s_support import NS

pytestmark = pytest.mark.kubernetes


def test_builds_discovery_and_elector_that_work(emulator: K8sApiEmulator) -> None:
    pieces = build_kubernetes(
        {
            "namespace": NS,
            "client": {"host": emulator.url},
            "pod_discovery": {"enabled": True},
            "leader_election": {"enabled": True, "lease_duration_s": 6, "renew_deadline_s": 4, "retry_period_s": 1},
        },
        {"POD_NAME": "fpm-planner-7d9-abc"},
    )
    assert pieces.discovery is not None and pieces.elector is not None
    assert pieces.elector.identity == "fpm-planner-7d9-abc"
    pieces.discovery.sync()
    assert pieces.discovery.workers(0.0) == {}
    assert pieces.elector.try_acquire_or_renew()
    pieces.stop()
    lease = emulator.get("leases", NS, "fpm-planner-leader")
    assert lease is not None and lease["spec"].get("holderIdentity") is None  # stopped = released


def test_disabled_builds_nothing() -> None:
    pieces = build_kubernetes({"namespace": NS}, {})
    assert pieces.discovery is None and pieces.elector is None


@pytest.mark.parametrize(
    "options,field",
    [
        ({}, "namespace"),
        ({"namespace": NS, "leader_election": {"enabled": True, "renew_deadline_s": 20}}, "renew_deadline_s"),
        ({"namespace": NS, "pod_discovery": {"labelSelector": "x"}}, "labelSelector"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_kubernetes(options, {})
