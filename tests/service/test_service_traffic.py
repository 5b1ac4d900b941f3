"""The traffic window the decision core read, shown where the operator looks (issue 13, item 2): a decision's
explain carries it (arrival rate, ISL/OSL mean and p50/p90/p99, observed TTFT/ITL p50/p90/p99, observed attainment,
window length), and so does the operator page (headless Chromium), from a real FPM publisher sending the traffic
extension over ZMQ into a real uvicorn service."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.service.support import AUTH, Served, free_port, make_config, registration, serve, wait_for
from tests.service.test_service_diagnostics_page import dump_dom
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.metrics import TrafficAccumulator
from worker_shim.publisher import FpmPublisher

# Every step sample carries the same requests: four arrivals, four first tokens, two completions. So any window
# holds whole copies of them: the means are exact, the percentiles within a log bucket (4.4 %), the attainment
# exact (the targets, TTFT 500 ms and ITL 50 ms by default, fall between the values, not inside their buckets).
PROMPTS = (500, 1000, 2000, 4000)  # mean 1875; p50 1000; p90, p99 4000
TTFTS_MS = (100.0, 100.0, 100.0, 5000.0)  # 3 of 4 at or under 500 ms; p50 100; p90, p99 5000
COMPLETIONS = ((100, 20.0), (300, 80.0))  # (output tokens, mean ITL ms): OSL mean 200; ITL: 1 of 2 under 50 ms


def step_traffic(acc: TrafficAccumulator) -> None:
    for tokens in PROMPTS:
        acc.arrival(tokens)
    for ttft in TTFTS_MS:
        acc.first_token(ttft)
    for tokens, itl in COMPLETIONS:
        acc.completion(tokens, itl)


@contextmanager
def busy_service() -> Iterator[Served]:
    """A service with one decode worker publishing steps with the traffic extension every 20 ms."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with (
        serve(make_config()) as served,
        FpmPublisher(worker_id="w-traffic", endpoint=endpoint, heartbeat_interval_s=0.05) as publisher,
    ):
        served.http.put("/v1/workers/w-traffic", json=registration([endpoint]), headers=AUTH).raise_for_status()
        stop = threading.Event()
        acc = TrafficAccumulator()

        def publish() -> None:
            while not stop.wait(0.02):
                step_traffic(acc)
                publisher.publish(
                    0.02,
                    ScheduledRequests(num_decode_requests=8, sum_decode_kv_tokens=8000),
                    QueuedRequests(),
                    traffic=acc.take(),
                )

        feeder = threading.Thread(target=publish, daemon=True)
        feeder.start()
        try:
            yield served
        finally:
            stop.set()
            feeder.join(5)


def close(got: Any, want: float, rel: float) -> bool:
    return got is not None and abs(got / want - 1) <= rel


def check_window(t: dict[str, Any]) -> None:
    """The figures of one traffic window of :func:`step_traffic` steps."""
    assert t["requests_in_window"] > 0 and t["requests_in_window"] % len(PROMPTS) == 0
    assert 0 < t["window_s"] <= 31.0
    assert close(t["request_rate_per_s"], t["requests_in_window"] / t["window_s"], 1e-9)
    assert close(t["isl_tokens"], sum(PROMPTS) / len(PROMPTS), 1e-9)
    assert close(t["osl_tokens"], 200.0, 1e-9)
    for key, want in (
        ("isl_tokens_p50", 1000),
        ("isl_tokens_p90", 4000),
        ("isl_tokens_p99", 4000),
        ("osl_tokens_p50", 100),
        ("osl_tokens_p90", 300),
        ("osl_tokens_p99", 300),
        ("ttft_ms_p50", 100),
        ("ttft_ms_p90", 5000),
        ("ttft_ms_p99", 5000),
        ("itl_ms_p50", 20),
        ("itl_ms_p90", 80),
        ("itl_ms_p99", 80),
    ):
        assert close(t[key], want, 0.045), (key, t[key], want)
    assert close(t["ttft_attainment_frac"], 0.75, 1e-9)
    assert close(t["itl_attainment_frac"], 0.5, 1e-9)
    assert t["ttft_samples_in_window"] == t["requests_in_window"]
    assert t["itl_samples_in_window"] * 2 == t["requests_in_window"]


def test_explain_shows_the_traffic_window_the_core_read() -> None:
    with busy_service() as served:

        def explained_with_traffic() -> dict[str, Any] | None:
            for d in served.http.get("/v1/decisions/latest").json()["decisions"]:
                if d["service"] == "decode":
                    got: dict[str, Any] = served.http.get(f"/v1/decisions/{d['id']}/explain").json()
                    traffic = got.get("traffic") or {}
                    if (traffic.get("itl_samples_in_window") or 0) >= 20:
                        return got
            return None

        explained = wait_for(explained_with_traffic)
        listed = served.http.get("/v1/decisions", params={"limit": 240}).json()["decisions"]

    traffic = explained["traffic"]
    check_window(traffic)
    # the explain's traffic is what the core read: its rate and mean lengths are the decision's inputs
    inputs = explained["inputs"]
    assert inputs["request_rate_per_s"] == traffic["request_rate_per_s"]
    assert inputs["isl_tokens"] == traffic["isl_tokens"]
    assert inputs["osl_tokens"] == traffic["osl_tokens"]
    # and the decision's record in the list carries the same window
    entry = next(d for d in listed if d["id"] == explained["id"])
    assert entry["traffic"] == traffic


def test_explain_of_a_decision_without_traffic_says_none(service: Served) -> None:
    """No worker sent the extension: the explain's traffic is null (unknown), not a window of zeros."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    service.http.put("/v1/workers/w-silent", json=registration([endpoint]), headers=AUTH).raise_for_status()
    decision = wait_for(
        lambda: next(
            (d for d in service.http.get("/v1/decisions/latest").json()["decisions"] if d["service"] == "decode"),
            None,
        )
    )
    explained = service.http.get(f"/v1/decisions/{decision['id']}/explain").json()
    assert "traffic" in explained and explained["traffic"] is None


@pytest.mark.browser
def test_the_page_shows_each_services_traffic_window() -> None:
    with busy_service() as served:
        wait_for(
            lambda: (
                (
                    (served.http.get("/v1/diagnostics").json()["traffic"].get("decode") or {}).get(
                        "itl_samples_in_window"
                    )
                    or 0
                )
                >= 20
            )
        )
        dom = dump_dom(f"{served.base_url}/diagnostics")
        shown = served.http.get("/v1/diagnostics").json()["traffic"]["decode"]

    row = re.search(r'<tr data-service="decode">(.*?)</tr>', dom, re.S)
    assert row is not None, "no traffic row for the decode service"
    cells = dict(re.findall(r'<td class="(\w+)">([^<]*)</td>', row.group(1)))
    numbers = {k: [float(x) for x in re.findall(r"\d+(?:\.\d+)?", v)] for k, v in cells.items()}
    assert 0 < numbers["window"][0] <= 31.0
    assert numbers["rate"][0] > 0 and numbers["requests"][0] % len(PROMPTS) == 0
    isl_mean, *isl_q = numbers["isl"]
    assert isl_mean == 1875
    assert isl_q == pytest.approx([1000, 4000, 4000], rel=0.045)
    assert numbers["osl"][0] == 200
    assert numbers["ttft"] == pytest.approx([100, 5000, 5000], rel=0.045)
    assert numbers["itl"] == pytest.approx([20, 80, 80], rel=0.045)
    assert re.fullmatch(r"75\.0 % \(\d+\) · 50\.0 % \(\d+\)", cells["attainment"]), cells["attainment"]
    check_window(shown)
