"""The decision core and the what-if run off the event loop with a deadline (issue 12, items 2-3 and the
structural guard): against a real uvicorn server and a real ``fpm-planner serve`` process, a hostile FPM sample
(``sum_prefill_tokens`` 2^64 - 1, through a real publisher) and a hostile what-if never stop ``/healthz`` from
answering within 1 s, and SIGTERM still stops the process; a tick that misses its deadline holds with a reason
and decides nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from planner.service.deadline import Busy, DeadlineMissed, OffLoop, TickHold
from tests.service.support import AUTH, free_port, make_config, registration, serve, wait_for
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher

PROFILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles" / "h200_llama31_8b_fp8_tp1"
HUGE = 2**64 - 1
HOSTILE_WHAT_IF = {"roles": {"prefill": {"request_rate_per_s": 0, "isl_tokens": 1e9, "queued_prefill_tokens": 1}}}
SLA_CORE = "core:\n  roles:\n    prefill: {service: prefill, mode: sla}\n    decode: {service: decode, mode: sla}\n"


def healthz_answers_within_1_s(base_url: str) -> bool:
    """One bounded wait: /healthz must answer (any status) within 1 s, else httpx raises and the test fails."""
    response = httpx.get(f"{base_url}/healthz", timeout=1.0)
    return response.status_code == 200


def publish_huge(publisher: FpmPublisher) -> None:
    publisher.publish(
        0.01,
        ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=HUGE, sum_prefill_kv_tokens=HUGE),
        QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=HUGE),
    )


def test_a_huge_sample_and_a_hostile_what_if_never_stop_healthz() -> None:
    config = make_config(FPM_PLANNER_TICK_INTERVAL_S="0.2")
    config = msgspec.structs.replace(
        config,
        core={"roles": {"prefill": {"service": "prefill", "mode": "sla"}}},
        perf_model=msgspec.structs.replace(config.perf_model, profile_dir=str(PROFILE)),
        what_if_deadline_s=2.0,
    )
    port = free_port()
    with serve(config) as served, FpmPublisher(worker_id="p-0", endpoint=f"tcp://127.0.0.1:{port}") as publisher:
        body = registration([f"tcp://127.0.0.1:{port}"], role="prefill", service="prefill")
        served.http.put("/v1/workers/p-0", json=body, headers=AUTH).raise_for_status()
        received = served.runner.subscriber.received
        for _ in range(40):
            publish_huge(publisher)
            assert healthz_answers_within_1_s(served.base_url)
            time.sleep(0.05)
        wait_for(lambda: served.runner.subscriber.received > received)  # the samples reached the planner
        first = served.runner.ticks
        wait_for(lambda: served.runner.ticks >= first + 3 and healthz_answers_within_1_s(served.base_url))
        answers: list[int] = []

        def ask() -> None:
            answers.append(httpx.post(f"{served.base_url}/v1/what-if", json=HOSTILE_WHAT_IF, timeout=30.0).status_code)

        asker = threading.Thread(target=ask)
        asker.start()
        while asker.is_alive():
            assert healthz_answers_within_1_s(served.base_url)
            asker.join(0.1)
        assert answers and answers[0] in (200, 504)  # decided in time, or the deadline answered for it
        assert healthz_answers_within_1_s(served.base_url)


def test_sigterm_stops_serve_fed_a_huge_sample_and_a_hostile_what_if(tmp_path: Path) -> None:
    fpm_port, http_port = free_port(), free_port()
    workers = tmp_path / "workers.yaml"
    workers.write_text(
        "workers:\n  - {worker_id: p-0, role: prefill, service: prefill, "
        f"fpm_endpoints: ['tcp://127.0.0.1:{fpm_port}']}}\n"
    )
    conf = tmp_path / "planner.yaml"
    conf.write_text(f"{SLA_CORE}perf_model: {{profile_dir: '{PROFILE}'}}\nwhat_if_deadline_s: 2.0\n")
    env = {
        **os.environ,
        "FPM_PLANNER_TICK_INTERVAL_S": "0.2",
        "FPM_PLANNER_TOKEN": "t" * 32,
        "FPM_PLANNER_WORKERS_FILE": str(workers),
    }
    base_url = f"http://127.0.0.1:{http_port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "serve", "--config", str(conf), "--port", str(http_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited early: {proc.stderr.read() if proc.stderr else ''}")
            try:
                return httpx.get(f"{base_url}/readyz", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s=60.0)
        with FpmPublisher(worker_id="p-0", endpoint=f"tcp://127.0.0.1:{fpm_port}") as publisher:
            for _ in range(30):
                publish_huge(publisher)
                assert healthz_answers_within_1_s(base_url)
                time.sleep(0.05)
            asker = threading.Thread(
                target=lambda: httpx.post(f"{base_url}/v1/what-if", json=HOSTILE_WHAT_IF, timeout=30.0), daemon=True
            )
            asker.start()
            for _ in range(20):
                assert healthz_answers_within_1_s(base_url)
                time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, stderr
    assert "Application shutdown complete" in stderr


def test_a_tick_that_misses_its_deadline_holds_with_a_reason_and_decides_nothing() -> None:
    config = msgspec.structs.replace(make_config(), tick_deadline_s=1e-9)
    with serve(config) as served:
        http = served.http

        def holding() -> dict[str, Any] | None:
            d: dict[str, Any] = http.get("/v1/diagnostics").json()
            missed = d["tick_holds"].get(TickHold.DECIDE_DEADLINE_MISSED.value, 0)
            return d if missed >= 3 and d["ticking"] is False else None

        diag = wait_for(holding)
        assert diag["last_tick_hold"]["reason"] in {h.value for h in TickHold}
        assert sum(diag["tick_holds"].values()) == diag["ticks"]  # every tick held
        assert http.get("/v1/decisions").json()["decisions"] == []
        assert http.get("/healthz").status_code == 200


def test_a_what_if_past_its_deadline_answers_504() -> None:
    config = msgspec.structs.replace(make_config(), what_if_deadline_s=1e-9)
    with serve(config) as served:
        response = served.http.post("/v1/what-if", json={"roles": {}})
        assert response.status_code == 504
        assert "did not finish in time" in response.json()["detail"]


def test_off_loop_refuses_a_call_while_every_slot_runs_and_never_stacks() -> None:
    release = threading.Event()

    async def scenario() -> None:
        off = OffLoop("t", clock=time.monotonic, slots=1)
        with pytest.raises(DeadlineMissed):
            await off.run(release.wait, 30.0, deadline_s=0.05)
        assert off.running == 1  # still running after its deadline
        with pytest.raises(Busy):
            await off.run(sum, (1, 2), deadline_s=5.0)
        release.set()
        while off.running:
            await asyncio.sleep(0.01)
        assert await off.run(sum, (1, 2), deadline_s=5.0) == 3
        with pytest.raises(ZeroDivisionError):
            await off.run(divmod, 1, 0, deadline_s=5.0)
        assert (off.missed, off.refused) == (1, 1)

    asyncio.run(scenario())


def test_a_replica_whose_ticks_stop_deciding_hands_the_lease_over() -> None:
    """Two replicas with Lease election against the API emulator: the one whose core misses every deadline
    stops renewing (it steps down once its start-up grace is over) and the healthy one leads."""
    from planner.service.serve_cli import build_runner
    from tests.fakes.k8s_api import K8sApiEmulator
    from tests.k8s.k8s_support import NS
    from tests.service.support import serve_runner
    from tests.service.test_service_kubernetes import k8s_config

    with K8sApiEmulator() as emu:
        stuck_config = msgspec.structs.replace(k8s_config(emu), tick_deadline_s=1e-9)
        stuck, stuck_pieces = build_runner(stuck_config, {"POD_NAME": "planner-stuck"})
        stuck_pieces.start()
        try:
            with serve_runner(stuck) as served:

                def holder() -> str:
                    lease = emu.get("leases", NS, "fpm-planner-leader")
                    return "" if lease is None else str(lease["spec"].get("holderIdentity") or "")

                wait_for(lambda: served.http.get("/v1/diagnostics").json()["tick_holds"])
                wait_for(lambda: stuck_pieces.elector.unhealthy and holder() != "planner-stuck")
                healthy, healthy_pieces = build_runner(k8s_config(emu), {"POD_NAME": "planner-ok"})
                healthy_pieces.start()
                try:
                    with serve_runner(healthy) as other:
                        wait_for(lambda: other.http.get("/v1/diagnostics").json()["leadership"] == "leader")
                        assert holder() == "planner-ok"
                        assert served.http.get("/v1/diagnostics").json()["leadership"] == "follower"
                        assert served.http.get("/healthz").status_code == 200
                finally:
                    healthy_pieces.stop()
        finally:
            stuck_pieces.stop()
