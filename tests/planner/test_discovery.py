"""Discovery sources: the static YAML file and the lease registry. Time is passed in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.discovery import (
    EngineCapacity,
    LeaseRegistry,
    Role,
    StaticFileDiscovery,
    WorkerRecord,
    parse_worker,
)
from planner.errors import DiscoveryError, LeaseError

GOOD = """
workers:
  - worker_id: decode-0
    role: decode
    service: VllmDecodeWorker
    dp_size: 2
    host: 10.1.0.5
    capacity: {max_num_batched_tokens: 8192, max_num_seqs: 256, max_model_len: 16384, kv_capacity_tokens: 945029}
  - worker_id: prefill-0
    role: prefill
    service: VllmPrefillWorker
    fpm_endpoints: ["ipc:///run/fpm/prefill-0"]
"""


def write(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a visible change even within one tick


def test_a_static_file_lists_workers_with_default_endpoints(tmp_path: Path) -> None:
    f = tmp_path / "workers.yaml"
    write(f, GOOD)
    workers = StaticFileDiscovery(f).workers(0.0)
    decode = workers["decode-0"]
    assert decode.role is Role.DECODE and decode.dp_size == 2
    assert decode.fpm_endpoints == ("tcp://10.1.0.5:20380", "tcp://10.1.0.5:20381")
    assert decode.capacity == EngineCapacity(
        max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=16384, kv_capacity_tokens=945029
    )
    assert workers["prefill-0"].fpm_endpoints == ("ipc:///run/fpm/prefill-0",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workers: [{worker_id: a, role: chef, service: s, host: h}]", "role"),
        ("workers: [{worker_id: '', role: agg, service: s, host: h}]", "worker_id must not be empty"),
        (
            "workers: [{worker_id: a, role: agg, service: s, dp_size: 2, fpm_endpoints: [tcp://h:1]}]",
            "1 fpm_endpoints for dp_size 2",
        ),
        (
            "workers: [{worker_id: a, role: agg, service: s, host: h}, {worker_id: a, role: agg, service: s, host: g}]",
            "listed twice",
        ),
        ("workers: {a: 1}", "'workers' list"),
        ("workers: [3]", r"workers\[0\] is not a mapping"),
        (
            "workers: [{worker_id: a, role: agg, service: s, host: h, capacity: {max_num_seqs: -1}}]",
            "capacity.max_num_seqs",
        ),
        ("workers: [", "cannot read"),
    ],
)
def test_a_bad_static_file_is_refused_with_the_problem_named(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "workers.yaml"
    write(f, text)
    with pytest.raises(DiscoveryError, match=message):
        StaticFileDiscovery(f)


def test_the_static_file_is_reread_on_change_and_a_broken_edit_keeps_the_last_good_list(tmp_path: Path) -> None:
    f = tmp_path / "workers.yaml"
    write(f, GOOD)
    source = StaticFileDiscovery(f)
    write(f, "workers: [{worker_id: only, role: agg, service: s, host: h}]")
    assert set(source.workers(1.0)) == {"only"}
    write(f, "workers: [")
    assert set(source.workers(2.0)) == {"only"}
    assert source.last_error is not None and "cannot read" in source.last_error
    f.unlink()
    assert set(source.workers(3.0)) == {"only"}


def rec(worker_id: str, endpoint: str) -> WorkerRecord:
    return parse_worker({"worker_id": worker_id, "role": "agg", "service": "s", "fpm_endpoints": [endpoint]})


def test_leases_register_renew_expire_and_deregister() -> None:
    reg = LeaseRegistry(default_ttl_s=10.0)
    assert reg.register(rec("a", "tcp://h:1"), now=0.0) == 10.0
    reg.register(rec("b", "tcp://h:2"), now=0.0, ttl_s=5.0)
    assert set(reg.workers(4.9)) == {"a", "b"}
    assert reg.renew("a", now=8.0) == 18.0
    assert set(reg.workers(10.0)) == {"a"}  # b lapsed at 5.0
    assert reg.expired == 1
    with pytest.raises(LeaseError, match="not registered"):
        reg.renew("b", now=10.0)
    assert reg.deregister("a") and not reg.deregister("a")
    assert reg.workers(10.0) == {}


def test_a_lease_lapses_exactly_at_its_expiry() -> None:
    reg = LeaseRegistry(default_ttl_s=10.0)
    reg.register(rec("a", "tcp://h:1"), now=0.0)
    assert "a" in reg.workers(9.999)
    assert "a" not in reg.workers(10.0)


def test_registering_another_workers_endpoint_is_refused() -> None:
    reg = LeaseRegistry()
    reg.register(rec("a", "tcp://h:1"), now=0.0)
    with pytest.raises(LeaseError, match="already registered by 'a'"):
        reg.register(rec("b", "tcp://h:1"), now=0.0)
    reg.register(rec("a", "tcp://h:1"), now=1.0)  # re-registering yourself renews


@pytest.mark.parametrize("ttl_s", [0.0, -1.0, 10_000.0])
def test_nonsense_lease_durations_are_refused(ttl_s: float) -> None:
    with pytest.raises(LeaseError, match="ttl_s"):
        LeaseRegistry(max_ttl_s=3600.0).register(rec("a", "tcp://h:1"), now=0.0, ttl_s=ttl_s)
