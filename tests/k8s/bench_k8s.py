"""Kubernetes path timings against the API emulator (loopback HTTP, official client): one scale request, one
status read, and pod-event-to-discovery latency. Prints one JSON line. Not a test (no timed asserts).

    PYTHONPATH=. .venv/bin/python tests/k8s/bench_k8s.py [--n 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from planner.actuators.base import ReplicaBounds, ScaleRequest
from planner.actuators.kubernetes import KubernetesActuator, KubernetesActuatorConfig, ScaleTarget, TargetKind
from planner.k8s.client import KubeClientConfig, make_api_client
from planner.k8s.discovery import PodDiscovery, PodDiscoveryConfig
from tests.fakes.k8s_api import K8sApiEmulator
from tests.k8s.k8s_support import NS, adapter, example_dgd


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    with K8sApiEmulator(adapter_controller=True) as emu:
        emu.put(example_dgd())
        emu.put(adapter("vllm-disagg", "decode", 1))
        api = make_api_client(KubeClientConfig(host=emu.url))
        b = ReplicaBounds(min_replicas=1, max_replicas=64)
        act = KubernetesActuator(
            api,
            KubernetesActuatorConfig(
                namespace=NS,
                targets=(
                    ScaleTarget(service="decode", kind=TargetKind.DGD, name="vllm-disagg", bounds=b),
                    ScaleTarget(service="prefill", kind=TargetKind.DGD, name="vllm-disagg", bounds=b),
                ),
            ),
        )
        scale_adapter, scale_patch, status = [], [], []
        for i in range(args.n):
            t0 = time.perf_counter()
            act.scale(ScaleRequest(service="decode", replicas=1 + (i % 2) + 1))
            t1 = time.perf_counter()
            act.scale(ScaleRequest(service="prefill", replicas=1 + (i % 2) + 1))
            t2 = time.perf_counter()
            act.status()
            t3 = time.perf_counter()
            scale_adapter.append(t1 - t0)
            scale_patch.append(t2 - t1)
            status.append(t3 - t2)
        seen = threading.Event()
        want: list[str] = [""]

        def changed() -> None:
            if want[0] and want[0] in disc.workers(0.0):
                seen.set()

        disc = PodDiscovery(api, PodDiscoveryConfig(namespace=NS), on_change=changed)
        disc.start()
        emu.wait_for_watchers(1)
        events = []
        for i in range(min(args.n, 200)):
            seen.clear()
            want[0] = f"w-{i}"
            t0 = time.perf_counter()
            emu.put(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"w-{i}", "namespace": NS, "labels": {"fpm-planner.io/role": "decode"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                    "status": {"phase": "Running", "podIP": f"10.1.{i // 250}.{i % 250}"},
                }
            )
            seen.wait(5)
            events.append(time.perf_counter() - t0)
        disc.stop()
    ms = 1000.0
    print(
        json.dumps(
            {
                "n": args.n,
                "scale_adapter_ms_p50": round(statistics.median(scale_adapter) * ms, 2),
                "scale_adapter_ms_p99": round(pct(scale_adapter, 0.99) * ms, 2),
                "scale_dgd_patch_ms_p50": round(statistics.median(scale_patch) * ms, 2),
                "scale_dgd_patch_ms_p99": round(pct(scale_patch, 0.99) * ms, 2),
                "status_2_services_ms_p50": round(statistics.median(status) * ms, 2),
                "pod_event_to_worker_ms_p50": round(statistics.median(events) * ms, 2),
                "pod_event_to_worker_ms_p99": round(pct(events, 0.99) * ms, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
