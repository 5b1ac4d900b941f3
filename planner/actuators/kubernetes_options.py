"""``actuator.options`` of the service configuration when ``actuator.kind`` is ``kubernetes``: the typed options,
and :func:`parse_options`, which turns them into scale targets and a client configuration. The actuator
(:func:`planner.actuators.kubernetes.from_options`) and the Events/conditions sink
(:func:`planner.k8s.status_sink.from_options`) read the same options through it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from planner.actuators.base import ReplicaBounds
from planner.actuators.kubernetes import ScaleTarget, TargetKind
from planner.errors import ConfigError
from planner.k8s.client import KubeClientConfig

__all__ = ["KubernetesOptions", "ParsedOptions", "parse_options"]


class _TargetOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    service: str
    kind: TargetKind = TargetKind.DGD
    name: str
    dgd_service: str = ""
    adapter: str = ""
    min_replicas: int = 0
    max_replicas: int = 64


class _ClientOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str | None = None
    in_cluster: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    verify_ssl: bool = True


class KubernetesOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``actuator.options`` of the service configuration when ``actuator.kind`` is ``kubernetes``."""

    namespace: str
    targets: tuple[_TargetOptions, ...]
    advisory: bool = False  # read status from the cluster, never write
    client: _ClientOptions = _ClientOptions()
    use_adapter: bool = True
    defer_scale_up_when_not_ready: bool = True
    max_attempts: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 30.0
    request_timeout_s: float = 10.0


class ParsedOptions(msgspec.Struct, frozen=True, kw_only=True):
    options: KubernetesOptions
    targets: tuple[ScaleTarget, ...]
    client: KubeClientConfig


def parse_options(options: Mapping[str, Any]) -> ParsedOptions:
    """The options, their scale targets (with their bounds) and the API client's configuration. Raises
    :class:`ConfigError` naming the offending field."""
    try:
        opts = msgspec.convert(dict(options), KubernetesOptions)
        targets = tuple(
            ScaleTarget(
                service=t.service,
                kind=t.kind,
                name=t.name,
                dgd_service=t.dgd_service,
                adapter=t.adapter,
                bounds=ReplicaBounds(min_replicas=t.min_replicas, max_replicas=t.max_replicas),
            )
            for t in opts.targets
        )
        client = KubeClientConfig(
            host=opts.client.host,
            in_cluster=opts.client.in_cluster,
            kubeconfig=opts.client.kubeconfig,
            context=opts.client.context,
            verify_ssl=opts.client.verify_ssl,
            request_timeout_s=opts.request_timeout_s,
        )
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"actuator.options: {exc}") from exc
    return ParsedOptions(options=opts, targets=targets, client=client)
