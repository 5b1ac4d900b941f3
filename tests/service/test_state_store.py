"""Durable runtime state: a local file written atomically, a ConfigMap with optimistic concurrency (against the
Kubernetes API emulator through the official client), and the bounded audit log of every change."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from planner.k8s.client import KubeClientConfig, make_api_client
from planner.service.state_store import (
    ConfigMapBackend,
    FileBackend,
    StateConflictError,
    StateStore,
    StateStoreError,
)
from tests.fakes.k8s_api import Fault, K8sApiEmulator

NS = "llm"


def clock() -> Callable[[], float]:
    ticks = itertools.count(1000)
    return lambda: float(next(ticks))


# ------------------------------------------------------------------------------------------------ file
def test_a_bound_set_at_run_time_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state" / "planner.json"
    store = StateStore(FileBackend(path), clock())
    store.load()
    rec = store.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    assert rec is not None and (rec.before, rec.after, rec.who, rec.at_s) == (None, {"max_replicas": 4}, "alice", 1000)
    store.set("pause", "*", {"by": "alice", "reason": "incident"}, who="alice", action="pause")
    store.set("registrations", "w-1", {"endpoint": "tcp://10.0.0.1:5557"}, who="worker", action="register")

    restarted = StateStore(FileBackend(path), clock())
    state = restarted.load()
    assert state.bounds == {"decode": {"max_replicas": 4}}
    assert state.pause == {"*": {"by": "alice", "reason": "incident"}}
    assert state.registrations == {"w-1": {"endpoint": "tcp://10.0.0.1:5557"}}
    assert [(r.who, r.action) for r in restarted.audit()] == [
        ("alice", "set bounds"),
        ("alice", "pause"),
        ("worker", "register"),
    ]
    assert sorted(p.name for p in path.parent.iterdir()) == ["planner.json", "planner.json.lock"]  # no temp left


def test_a_change_records_from_and_to_and_a_removal(tmp_path: Path) -> None:
    store = StateStore(FileBackend(tmp_path / "s.json"), clock())
    store.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    rec = store.set("bounds", "decode", {"max_replicas": 8}, who="bob", action="set bounds")
    assert rec is not None and (rec.before, rec.after, rec.who) == ({"max_replicas": 4}, {"max_replicas": 8}, "bob")
    gone = store.set("pause", "*", None, who="bob", action="resume")
    assert gone is None  # nothing to remove: no write, no record
    store.set("pause", "*", {"by": "bob"}, who="bob", action="pause")
    resumed = store.set("pause", "*", None, who="carol", action="resume")
    assert resumed is not None and (resumed.before, resumed.after) == ({"by": "bob"}, None)
    assert store.state.pause == {}


def test_an_unchanged_value_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    store = StateStore(FileBackend(path), clock())
    store.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    before = path.read_bytes()
    assert store.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds") is None
    assert path.read_bytes() == before and len(store.audit()) == 1


def test_the_audit_log_is_bounded_oldest_dropped(tmp_path: Path) -> None:
    store = StateStore(FileBackend(tmp_path / "s.json"), clock(), audit_limit=3)
    for n in range(1, 6):
        store.set("bounds", "decode", {"max_replicas": n}, who=f"op{n}", action="set bounds")
    assert [r.who for r in store.audit()] == ["op3", "op4", "op5"]
    assert [r.who for r in store.audit(limit=1)] == ["op5"]


def test_two_planners_on_one_file_lose_no_change(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    a = StateStore(FileBackend(path), clock())
    b = StateStore(FileBackend(path), clock())
    a.load()
    b.load()  # both read the empty state, then write in turn: each write re-reads
    a.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    b.set("bounds", "prefill", {"max_replicas": 2}, who="bob", action="set bounds")
    assert a.load().bounds == {"decode": {"max_replicas": 4}, "prefill": {"max_replicas": 2}}


def test_a_stale_file_write_is_a_conflict(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "s.json")
    state, version = backend.read()
    StateStore(backend, clock()).set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    with pytest.raises(StateConflictError):
        backend.write(state, version)


def test_a_corrupt_state_file_is_a_clear_error_and_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("{not json")
    store = StateStore(FileBackend(path), clock())
    with pytest.raises(StateStoreError, match=r"s\.json is not valid"):
        store.load()
    with pytest.raises(StateStoreError):
        store.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    assert path.read_text() == "{not json"  # nothing lost


def test_bad_calls_are_refused(tmp_path: Path) -> None:
    store = StateStore(FileBackend(tmp_path / "s.json"), clock())
    with pytest.raises(StateStoreError, match="unknown state section"):
        store.set("nope", "x", 1, who="alice", action="x")
    with pytest.raises(StateStoreError, match="name of who"):
        store.set("bounds", "x", 1, who="", action="x")


def test_each_change_is_logged_with_the_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="planner.audit")
    StateStore(FileBackend(tmp_path / "s.json"), clock()).set(
        "bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds"
    )
    (line,) = [r.getMessage() for r in caplog.records if r.name == "planner.audit"]
    assert '"who":"alice"' in line and '"after":{"max_replicas":4}' in line and '"before":null' in line


# ------------------------------------------------------------------------------------------------ ConfigMap
@pytest.fixture
def emulator() -> Iterator[K8sApiEmulator]:
    with K8sApiEmulator() as emu:
        yield emu


@pytest.fixture
def make_client(emulator: K8sApiEmulator) -> Iterator[Callable[[], k8s.ApiClient]]:
    clients: list[k8s.ApiClient] = []

    def make() -> k8s.ApiClient:
        clients.append(make_api_client(KubeClientConfig(host=emulator.url)))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


@pytest.mark.kubernetes
def test_the_configmap_state_survives_a_failover(
    emulator: K8sApiEmulator, make_client: Callable[[], k8s.ApiClient]
) -> None:
    leader = StateStore(ConfigMapBackend(make_client(), NS, "fpm-planner-state"), clock())
    assert leader.load().generation == 0  # no ConfigMap yet
    leader.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    leader.set("pause", "*", {"by": "alice"}, who="alice", action="pause")
    leader.set("registrations", "w-1", {"endpoint": "tcp://10.0.0.1:5557"}, who="worker", action="register")

    standby = StateStore(ConfigMapBackend(make_client(), NS, "fpm-planner-state"), clock())
    state = standby.load()
    assert state.bounds == {"decode": {"max_replicas": 4}} and "*" in state.pause and "w-1" in state.registrations
    assert [r.who for r in standby.audit()] == ["alice", "alice", "worker"]
    cm = emulator.get("configmaps", NS, "fpm-planner-state")
    assert cm is not None and "state.json" in cm["data"]


@pytest.mark.kubernetes
def test_a_configmap_write_that_loses_the_race_is_reapplied(
    emulator: K8sApiEmulator, make_client: Callable[[], k8s.ApiClient]
) -> None:
    a = StateStore(ConfigMapBackend(make_client(), NS, "st"), clock())
    b = StateStore(ConfigMapBackend(make_client(), NS, "st"), clock())
    a.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    # b's first PUT is answered 409 as if another replica had written between its read and its write.
    fault = emulator.inject(Fault("PUT", r"/configmaps/st$", status=409))
    b.set("bounds", "prefill", {"max_replicas": 2}, who="bob", action="set bounds")
    assert fault.hits == 1
    assert a.load().bounds == {"decode": {"max_replicas": 4}, "prefill": {"max_replicas": 2}}
    puts = [p for m, p in emulator.requests if m == "PUT"]
    assert len(puts) == 2


@pytest.mark.kubernetes
def test_a_stale_configmap_write_is_refused_by_the_server(make_client: Callable[[], k8s.ApiClient]) -> None:
    backend = ConfigMapBackend(make_client(), NS, "st")
    StateStore(backend, clock()).set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    state, version = backend.read()
    StateStore(backend, clock()).set("bounds", "decode", {"max_replicas": 5}, who="bob", action="set bounds")
    with pytest.raises(StateConflictError):
        backend.write(state, version)
    assert backend.read()[0].bounds == {"decode": {"max_replicas": 5}}


@pytest.mark.kubernetes
def test_a_conflict_that_never_ends_is_an_error(
    emulator: K8sApiEmulator, make_client: Callable[[], k8s.ApiClient]
) -> None:
    store = StateStore(ConfigMapBackend(make_client(), NS, "st"), clock(), max_attempts=3)
    store.set("bounds", "decode", {"max_replicas": 4}, who="alice", action="set bounds")
    emulator.inject(Fault("PUT", r"/configmaps/st$", status=409, times=None))
    with pytest.raises(StateStoreError, match="after 3 attempts"):
        store.set("bounds", "decode", {"max_replicas": 5}, who="bob", action="set bounds")


@pytest.mark.kubernetes
def test_an_unreachable_api_server_is_a_state_error(
    emulator: K8sApiEmulator, make_client: Callable[[], k8s.ApiClient]
) -> None:
    store = StateStore(ConfigMapBackend(make_client(), NS, "st"), clock())
    emulator.inject(Fault("GET", r"/configmaps/st$", status=500))
    with pytest.raises(StateStoreError, match="cannot read configmap llm/st: 500"):
        store.load()
