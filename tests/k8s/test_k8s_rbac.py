"""The Helm chart's Role grants exactly the verbs the planner uses: every code path runs under the rendered rules
without a 403, and every granted (group, resource, verb) is exercised."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from planner.actuators.advisory import AdvisoryActuator
from planner.actuators.base import OutcomeKind, ReplicaBounds, ScaleRequest
from planner.actuators.kubernetes import KubernetesActuator, KubernetesActuatorConfig, ScaleTarget, TargetKind
from planner.k8s.discovery import PodDiscovery, PodDiscoveryConfig
from planner.k8s.events import EventReason, EventType, ScaleStatus
from planner.k8s.leader import LeaderElectionConfig, LeaseElector
from planner.k8s.status_sink import KubeStatusSink
from planner.service.state_store import ConfigMapBackend, StateStore
from tests.fakes.k8s_api import K8sApiEmulator
from tests.k8s.k8s_support import NS, FakeSleep, adapter, deployment, example_dgd

pytestmark = pytest.mark.kubernetes

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "fpm-planner"
B = ReplicaBounds(min_replicas=1, max_replicas=8)
TARGETS = (
    ScaleTarget(service="decode", kind=TargetKind.DGD, name="vllm-disagg", bounds=B),  # has an adapter
    ScaleTarget(service="prefill", kind=TargetKind.DGD, name="vllm-disagg", bounds=B),  # no adapter: DGD patch
    ScaleTarget(service="agg", kind=TargetKind.DEPLOYMENT, name="vllm-agg", bounds=B),
    ScaleTarget(service="sts", kind=TargetKind.STATEFULSET, name="vllm-sts", bounds=B),
)


def render_rules(*, dynamo: bool, apps: bool, advisory: bool) -> list[dict[str, Any]]:
    """Render the Role's ``rules`` from templates/role.yaml for the given values (the template keeps its
    directives simple enough for this: whole-line if/end blocks and inline if/end around one verb)."""
    values = {
        ".Values.rbac.create": True,
        ".Values.rbac.dynamo": dynamo,
        ".Values.rbac.apps": apps,
        ".Values.planner.advisory": advisory,
    }

    def cond(expr: str) -> bool:
        expr = expr.strip()
        if expr.startswith("not "):
            return not values[expr[4:].strip()]
        return values[expr]

    text = (CHART / "templates" / "role.yaml").read_text()
    text = text.split("rules:", 1)[1].split("---", 1)[0]
    text = re.sub(
        r"\{\{-? if ([^}]*?) -?\}\}(.*?)\{\{-? end -?\}\}", lambda m: m.group(2) if cond(m.group(1)) else "", text
    )
    out, stack = [], []
    for line in text.splitlines():
        m = re.fullmatch(r"\s*\{\{-? if (.*?) -?\}\}\s*", line)
        if m:
            stack.append(cond(m.group(1)))
            continue
        if re.fullmatch(r"\s*\{\{-? end -?\}\}\s*", line):
            stack.pop()
            continue
        if "{{" in line:
            raise AssertionError(f"unexpected template directive in the rules: {line!r}")
        if all(stack):
            out.append(line)
    rules: list[dict[str, Any]] = yaml.safe_load("\n".join(out))
    return rules


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(verb, group, resource) triples, as the emulator audits them."""
    return {(v, g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.fixture
def cluster(emulator: K8sApiEmulator) -> K8sApiEmulator:
    emulator.put(example_dgd())
    emulator.put(adapter("vllm-disagg", "decode", 1))
    emulator.put(deployment("vllm-agg", 1))
    emulator.put(deployment("vllm-sts", 1, kind="StatefulSet"))
    emulator.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "d-0", "namespace": NS, "labels": {"fpm-planner.io/role": "decode"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    emulator.audit.clear()
    return emulator


def exercise_everything(api: k8s.ApiClient, targets: tuple[ScaleTarget, ...], *, advisory: bool) -> list[Any]:
    """Every Kubernetes code path of the planner once: status, scale of every target kind, pod list + watch,
    leader create / renew / release. Returns the scale outcomes."""
    act = KubernetesActuator(api, KubernetesActuatorConfig(namespace=NS, targets=targets), sleep=FakeSleep())
    outcomes: list[Any] = []
    if advisory:
        adv = AdvisoryActuator({t.service: t.bounds for t in targets}, reader=act)
        adv.status()
        outcomes += [adv.scale(ScaleRequest(service=t.service, replicas=3)) for t in targets]
    else:
        act.status()
        outcomes += [act.scale(ScaleRequest(service=t.service, replicas=3)) for t in targets]
    disc = PodDiscovery(api, PodDiscoveryConfig(namespace=NS, watch_timeout_s=1))
    disc.sync()
    disc.watch_once()
    assert set(disc.workers(0.0)) == {"d-0"}
    elector = LeaseElector(api, LeaderElectionConfig(namespace=NS, identity="p-0"))
    assert elector.try_acquire_or_renew()  # create
    assert elector.try_acquire_or_renew()  # get + update
    assert elector.release()
    store = StateStore(ConfigMapBackend(api, NS, "fpm-planner-state"), lambda: 0.0)
    store.set("pause", "*", {"by": "alice"}, who="alice", action="pause")  # get (404) + create
    store.set("pause", "*", None, who="alice", action="resume")  # get + update
    if not advisory:  # Events (create, then a repeat patches its series) and conditions on every target kind
        sink = KubeStatusSink(api, NS, {t.service: t for t in targets})
        for t in targets:
            for _ in range(2):
                assert sink.event(t.service, EventType.NORMAL, EventReason.SUCCESSFUL_RESCALE, "New size: 3", 0.0)
            sink.conditions(t.service, ScaleStatus(), 0.0)
        assert sink.recorder.failures == 0 and sink.recorder.written == 2 * len(targets)
    return outcomes


def test_role_grants_exactly_what_the_planner_uses(cluster: K8sApiEmulator, api_client: k8s.ApiClient) -> None:
    rules = render_rules(dynamo=True, apps=True, advisory=False)
    cluster.rbac_rules = rules
    outcomes = exercise_everything(api_client, TARGETS, advisory=False)
    assert [o.kind for o in outcomes] == [OutcomeKind.APPLIED] * 4
    assert set(cluster.audit) == granted(rules)


def test_advisory_role_is_read_only_and_sufficient(cluster: K8sApiEmulator, api_client: k8s.ApiClient) -> None:
    rules = render_rules(dynamo=True, apps=True, advisory=True)
    # No write anywhere but the Lease and the runtime state's ConfigMap.
    advisory = granted(rules)
    assert advisory and all(v in ("get", "list", "watch") or r in ("leases", "configmaps") for v, _, r in advisory)
    cluster.rbac_rules = rules
    outcomes = exercise_everything(api_client, TARGETS, advisory=True)
    assert [o.kind for o in outcomes] == [OutcomeKind.ADVISORY] * 4
    assert set(cluster.audit) == granted(rules)


def test_a_dynamo_only_role_forbids_deployment_targets_by_name(
    cluster: K8sApiEmulator, api_client: k8s.ApiClient
) -> None:
    cluster.rbac_rules = render_rules(dynamo=True, apps=False, advisory=False)
    act = KubernetesActuator(api_client, KubernetesActuatorConfig(namespace=NS, targets=TARGETS), sleep=FakeSleep())
    out = act.scale(ScaleRequest(service="agg", replicas=2))
    assert out.kind is OutcomeKind.FORBIDDEN
    assert "'get'" in out.message and "deployments/scale" in out.message
    assert act.scale(ScaleRequest(service="decode", replicas=2)).kind is OutcomeKind.APPLIED
