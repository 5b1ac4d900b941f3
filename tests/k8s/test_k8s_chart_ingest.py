"""The chart's ingest values, rendered by Helm's own template engine (``helm-python-sdk``: Helm's Go SDK, bundled,
offline): NATS off changes nothing; ``ingest.transport: nats`` reaches the planner's configuration (loaded by the
real config loader) with its password file the mounted Secret; the shard StatefulSet runs ``python -m
planner.shard`` with flags its parser accepts (following the leader, which the planner's configuration then is in
sharded mode for, or a workers file with a shard set naming exactly its pods); CURVE Secrets are mounted where the
configuration reads them; values that cannot work fail the render, naming the value."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from planner.service.config import load_config
from planner.shard.__main__ import _parser as shard_parser
from planner.transport.settings import Transport

pytestmark = pytest.mark.kubernetes

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "fpm-planner"
RELEASE = "rel"
NS = "llm"

NATS_ON: dict[str, Any] = {
    "ingest": {
        "transport": "nats",
        "nats": {
            "servers": ["nats://nats-0.nats:4222", "nats://nats-1.nats:4222"],
            "namespace": "prod",
            "user": "planner",
            "existingSecret": "fpm-nats",
            "passwordKey": "planner-password",
        },
    },
    "shards": {"replicas": 3, "workersConfigMap": {"name": "fleet-workers", "key": "workers.yaml"}},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values`` (a ``helm template``)."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NS)
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def planner_config(docs: list[dict[str, Any]], tmp_path: Path) -> Any:
    path = tmp_path / "planner.yaml"
    path.write_text(one(docs, "ConfigMap", f"{RELEASE}-fpm-planner")["data"]["planner.yaml"])
    return load_config(path, {})


def mounted(pod: dict[str, Any], container: str, file: str) -> tuple[str, str, str]:
    """``(volume kind, object name, key)`` of what the pod shows ``container`` at path ``file`` (as the kubelet
    lays a Secret/ConfigMap volume out: one file per key, or per ``items`` entry under its ``path``)."""
    (ctr,) = [c for c in pod["containers"] if c["name"] == container]
    for mount in ctr.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if not file.startswith(prefix):
            continue
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        kind = "secret" if "secret" in volume else "configMap"
        source = volume[kind]
        name = source["secretName"] if kind == "secret" else source["name"]
        rest = file.removeprefix(prefix)
        for item in source.get("items", []):
            if item["path"] == rest:
                return kind, name, item["key"]
        assert "items" not in source, f"{file}: no item of {name} is laid out there"
        return kind, name, rest
    raise AssertionError(f"{file} is not mounted in {container}")


def test_the_chart_declares_no_dependency_it_does_not_ship() -> None:
    """`helm template` fails on a declared dependency missing from charts/, whatever its condition: the chart
    must render offline, so NATS is an external URL (the official NATS chart is installed on its own)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for dep in chart.get("dependencies", []):
        assert (CHART / "charts" / dep["name"]).is_dir() or list((CHART / "charts").glob(f"{dep['name']}-*.tgz"))


def test_nats_settings_do_nothing_until_transport_nats_and_by_default_transport_is_zmq() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["ingest"]["transport"] == "zmq" and values["shards"]["replicas"] == 0
    inert = copy.deepcopy(NATS_ON)
    inert["ingest"]["transport"] = "zmq"
    inert["shards"]["replicas"] = 0
    default = render({})
    assert render(inert) == default
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in default)
    assert kinds == [
        ("ConfigMap", f"{RELEASE}-fpm-planner"), ("Deployment", f"{RELEASE}-fpm-planner"),
        ("Role", f"{RELEASE}-fpm-planner"), ("RoleBinding", f"{RELEASE}-fpm-planner"),
        ("Service", f"{RELEASE}-fpm-planner"), ("ServiceAccount", f"{RELEASE}-fpm-planner"),
    ]  # fmt: skip
    assert "ingest" not in yaml.safe_load(one(default, "ConfigMap", f"{RELEASE}-fpm-planner")["data"]["planner.yaml"])


def test_transport_nats_reaches_the_planners_config_with_its_password_the_mounted_secret(tmp_path: Path) -> None:
    docs = render({"ingest": NATS_ON["ingest"]})
    config = planner_config(docs, tmp_path)
    nats = config.ingest.nats
    assert config.ingest.transport is Transport.NATS
    assert nats.servers == ("nats://nats-0.nats:4222", "nats://nats-1.nats:4222")
    assert (nats.namespace, nats.user) == ("prod", "planner")
    assert nats.password_file is not None
    pod = one(docs, "Deployment", f"{RELEASE}-fpm-planner")["spec"]["template"]["spec"]
    assert mounted(pod, "planner", nats.password_file) == ("secret", "fpm-nats", "planner-password")
    assert not [d for d in docs if d["kind"] == "StatefulSet"]  # shards are optional


def test_shards_follow_the_leader_by_default_and_the_planner_reads_their_summaries(tmp_path: Path) -> None:
    docs = render({"ingest": NATS_ON["ingest"], "shards": {"replicas": 2, "maxSummaryAgeS": 2.5, "perfPointsPerS": 64}})
    config = planner_config(docs, tmp_path)
    assert config.ingest.shards.enabled and config.ingest.shards.max_summary_age_s == 2.5
    assert config.ingest.shards.perf_points_per_s == 64
    sts = one(docs, "StatefulSet", f"{RELEASE}-fpm-planner-shard")
    (ctr,) = sts["spec"]["template"]["spec"]["containers"]
    args = shard_parser().parse_args([a.replace("$(POD_NAME)", "rel-fpm-planner-shard-0") for a in ctr["args"]])
    assert args.workers_from_leader and args.workers_file is None and args.shards_file is None
    assert args.nats_url == NATS_ON["ingest"]["nats"]["servers"] and args.namespace == config.ingest.nats.namespace
    assert args.user == config.ingest.nats.user and args.ttl_s == config.ingest.ttl_s
    assert "volumes" not in sts["spec"]["template"]["spec"]
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-shard")]
    zmq_only = planner_config(render({"ingest": NATS_ON["ingest"]}), tmp_path)
    assert not zmq_only.ingest.shards.enabled  # no shards: the planner ingests every sample itself


def test_shards_from_a_workers_file_run_with_accepted_flags_over_exactly_their_pods() -> None:
    docs = render(NATS_ON)
    planner = one(docs, "Deployment", f"{RELEASE}-fpm-planner")
    sts = one(docs, "StatefulSet", f"{RELEASE}-fpm-planner-shard")
    pod = sts["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert sts["spec"]["replicas"] == 3
    assert ctr["image"] == planner["spec"]["template"]["spec"]["containers"][0]["image"]
    assert ctr["command"] == ["python", "-m", "planner.shard"]
    pod_names = [f"{sts['metadata']['name']}-{i}" for i in range(3)]
    env = {e["name"]: e for e in ctr["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["FPM_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "fpm-nats", "key": "planner-password"}
    args = shard_parser().parse_args([a.replace("$(POD_NAME)", pod_names[1]) for a in ctr["args"]])
    assert args.shard_id == pod_names[1]
    assert args.nats_url == NATS_ON["ingest"]["nats"]["servers"] and args.namespace == "prod"
    assert args.user == "planner" and args.summary_interval_s == 1 and args.ttl_s == 10
    kind, name, key = mounted(pod, "shard", args.shards_file)
    shard_set = one(docs, "ConfigMap", name)["data"][key]
    assert kind == "configMap" and shard_set.split() == pod_names  # the shard set is exactly the pods
    assert mounted(pod, "shard", args.workers_file) == ("configMap", "fleet-workers", "workers.yaml")
    # the planner's Deployment and Service never select shard pods, nor the shards' selector planner pods
    shard_labels = sts["spec"]["template"]["metadata"]["labels"]
    planner_labels = planner["spec"]["template"]["metadata"]["labels"]
    service = one(docs, "Service", f"{RELEASE}-fpm-planner")
    for selector in (planner["spec"]["selector"]["matchLabels"], service["spec"]["selector"]):
        assert not selector.items() <= shard_labels.items()
    assert not sts["spec"]["selector"]["matchLabels"].items() <= planner_labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= shard_labels.items()
    assert one(docs, "Service", sts["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def test_curve_secrets_are_mounted_where_the_planners_config_reads_them(tmp_path: Path) -> None:
    curve = {
        "serverPublicKeySecret": {"name": "fpm-curve-server", "key": "server.key"},
        "clientSecretKeySecret": {"name": "fpm-curve-planner", "key": "planner.key_secret"},
    }
    docs = render({"ingest": {"curve": curve}})
    ingest = planner_config(docs, tmp_path).ingest
    pod = one(docs, "Deployment", f"{RELEASE}-fpm-planner")["spec"]["template"]["spec"]
    assert ingest.transport is Transport.ZMQ
    assert ingest.curve_server_public_key_file is not None and ingest.curve_client_secret_key_file is not None
    assert mounted(pod, "planner", ingest.curve_server_public_key_file) == ("secret", "fpm-curve-server", "server.key")
    client = mounted(pod, "planner", ingest.curve_client_secret_key_file)
    assert client == ("secret", "fpm-curve-planner", "planner.key_secret")
    only_server = planner_config(
        render({"ingest": {"curve": {"serverPublicKeySecret": curve["serverPublicKeySecret"]}}}), tmp_path
    )
    assert only_server.ingest.curve_client_secret_key_file is None  # the planner draws its own keypair


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ingest": {"transport": "kafka"}}, "ingest.transport must be zmq or nats"),
        ({"ingest": {"transport": "nats"}}, "ingest.nats.servers"),
        ({"shards": {"replicas": 2, "workersConfigMap": {"name": "w"}}}, "shards.replicas > 0 needs ingest.transport"),
    ],
)
def test_values_that_cannot_work_fail_the_render_naming_them(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)
