"""The subscriber's per-endpoint reconnect counters reach /metrics and /v1/diagnostics of the real service
(issue 12, item 6): an endpoint that is not ZMQ at all shows up as disconnects, with its backoff."""

from __future__ import annotations

import re

from planner.bench.faults import GarbagePeer
from tests.service.support import AUTH, make_config, registration, serve, wait_for


def _disconnects(metrics: str) -> float:
    match = re.search(r'^fpm_planner_fpm_link_events_total\{event="disconnect"\} (\S+)$', metrics, re.M)
    return float(match.group(1)) if match else 0.0


def test_disconnects_of_a_non_zmq_endpoint_show_in_metrics_and_diagnostics() -> None:
    garbage = GarbagePeer(seed=9)
    try:
        with serve(make_config()) as served:
            http = served.http
            http.put("/v1/workers/g", json=registration([garbage.endpoint]), headers=AUTH).raise_for_status()
            wait_for(lambda: _disconnects(http.get("/metrics").text) >= 2)
            ingest = http.get("/v1/diagnostics", headers=AUTH).json()["ingest"]
            assert ingest["links"]["disconnects"] >= 2
            (link,) = [t for t in ingest["links_troubled"] if t["endpoint"] == garbage.endpoint]
            assert link["disconnects"] >= 2 and not link["connected"]
            assert "fpm_planner_fpm_endpoints_backing_off" in http.get("/metrics").text
    finally:
        garbage.close()
