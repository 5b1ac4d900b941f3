"""The service takes traffic from FPM (issue 13, item 2): a worker publishing step samples with the traffic
extension over real ZMQ shows in the core's observation, in ``/v1/diagnostics`` (``traffic``) and in Prometheus
(``fpm_planner_observed_*``), with no router and no frontend."""

from __future__ import annotations

import time

import msgspec

from planner.discovery import Role
from tests.service.support import AUTH, free_port, make_config, registration, serve, wait_for
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.metrics import TrafficAccumulator
from worker_shim.publisher import FpmPublisher

STEP = ScheduledRequests(num_decode_requests=4, sum_decode_kv_tokens=4000)


def test_fpm_traffic_reaches_the_core_diagnostics_and_metrics() -> None:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    config = msgspec.structs.replace(make_config(), tick_interval_s=0.1)
    with (
        serve(config) as served,
        FpmPublisher(worker_id="w-1", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher,
    ):
        put = served.http.put("/v1/workers/w-1", json=registration([endpoint]), headers=AUTH)
        put.raise_for_status()
        runner = served.runner
        wait_for(lambda: runner.store.rank_view("w-1", 0, runner.now()).heartbeats > 0)  # subscribed
        acc = TrafficAccumulator()
        for i in range(20):  # 20 requests: prompts 1000 tokens, 128 out, TTFT 300 ms / 3000 ms, ITL 20 ms
            acc.arrival(1000)
            acc.first_token(300.0 if i % 4 else 3000.0)
            acc.completion(128, 20.0)
            publisher.publish(0.02, STEP, QueuedRequests(), acc.take())
            time.sleep(0.01)

        def seen() -> dict[str, object] | None:
            block = served.http.get("/v1/diagnostics").json().get("traffic", {}).get("decode")
            return block if block and block.get("requests_in_window") == 20 else None

        block = wait_for(seen)
        assert block["isl_tokens"] == 1000.0 and block["osl_tokens"] == 128.0
        assert block["ttft_samples_in_window"] == 20 and block["itl_samples_in_window"] == 20
        # the core's default SLA for decode: TTFT 500 ms, ITL 50 ms: a quarter of the TTFTs miss it
        assert block["ttft_attainment_frac"] == 0.75 and block["itl_attainment_frac"] == 1.0
        assert block["request_rate_per_s"] > 0

        # The next tick reads what the diagnostics showed (a tick may have begun before the last burst arrived).
        def observed() -> int:
            observation = runner.decider.last_observation
            traffic = observation.traffic.get(Role.DECODE) if observation is not None else None
            return traffic.requests_in_window if traffic is not None else 0

        assert wait_for(lambda: observed() == 20)
        metrics = served.http.get("/metrics").text
        assert 'fpm_planner_observed_attainment_frac{service="decode",target="ttft"} 0.75' in metrics
        assert 'fpm_planner_observed_isl_tokens{quantile="0.9",service="decode"} 1000.0' in metrics
        assert 'fpm_planner_observed_request_rate_per_s{service="decode"}' in metrics
        assert 'fpm_planner_observed_ttft_ms{quantile="0.99",service="decode"}' in metrics
