"""Typed options for the planner's Kubernetes pieces other than the actuator, and one builder the service calls.

The service configuration carries them as a mapping (``kubernetes:`` in the chart's ``planner.yaml``)::

    kubernetes:
      namespace: llm
      client: {in_cluster: true}
      pod_discovery: {enabled: true, label_selector: "fpm-planner.io/role"}
      leader_election: {enabled: true, lease_name: fpm-planner-leader, lease_duration_s: 15,
                        renew_deadline_s: 10, retry_period_s: 2}

The leader identity comes from the environment mapping passed in (``POD_NAME``, set by the chart through the
downward API), falling back to the host name.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import msgspec

from planner.errors import ConfigError
from planner.k8s.client import KubeClientConfig, make_api_client
from planner.k8s.discovery import ROLE_LABEL, PodDiscovery, PodDiscoveryConfig
from planner.k8s.leader import LeaderElectionConfig, LeaseElector

__all__ = ["KubernetesPieces", "KubernetesServiceOptions", "build_kubernetes"]


class _Client(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str | None = None
    in_cluster: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    verify_ssl: bool = True
    request_timeout_s: float = 10.0


class _PodDiscovery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    enabled: bool = False
    label_selector: str = ROLE_LABEL
    watch_timeout_s: int = 300
    retry_backoff_s: float = 1.0


class _LeaderElection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    enabled: bool = False
    lease_name: str = "fpm-planner-leader"
    identity: str | None = None  # default: $POD_NAME, then the host name
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


class KubernetesServiceOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    namespace: str
    client: _Client = _Client()
    pod_discovery: _PodDiscovery = _PodDiscovery()
    leader_election: _LeaderElection = _LeaderElection()


class KubernetesPieces:
    """What :func:`build_kubernetes` made; either may be None when disabled. Start them with ``start()`` and
    stop them with ``stop()`` (the elector releases its Lease on stop)."""

    def __init__(self, discovery: PodDiscovery | None, elector: LeaseElector | None) -> None:
        self.discovery = discovery
        self.elector = elector

    def start(self) -> None:
        if self.discovery is not None:
            self.discovery.start()
        if self.elector is not None:
            self.elector.start()

    def stop(self) -> None:
        if self.elector is not None:
            self.elector.stop(release=True)
        if self.discovery is not None:
            self.discovery.stop()


def build_kubernetes(options: Mapping[str, Any], env: Mapping[str, str]) -> KubernetesPieces:
    """Pod discovery and the Lease elector from ``options`` (see the module docstring). Raises
    :class:`ConfigError` naming the offending field."""
    try:
        opts = msgspec.convert(dict(options), KubernetesServiceOptions)
        c = opts.client
        client_cfg = KubeClientConfig(
            host=c.host,
            in_cluster=c.in_cluster,
            kubeconfig=c.kubeconfig,
            context=c.context,
            verify_ssl=c.verify_ssl,
            request_timeout_s=c.request_timeout_s,
        )
        disc_cfg = PodDiscoveryConfig(
            namespace=opts.namespace,
            label_selector=opts.pod_discovery.label_selector,
            watch_timeout_s=opts.pod_discovery.watch_timeout_s,
            retry_backoff_s=opts.pod_discovery.retry_backoff_s,
            request_timeout_s=c.request_timeout_s,
        )
        le = opts.leader_election
        identity = le.identity or env.get("POD_NAME") or socket.gethostname()
        le_cfg = LeaderElectionConfig(
            namespace=opts.namespace,
            identity=identity,
            lease_name=le.lease_name,
            lease_duration_s=le.lease_duration_s,
            renew_deadline_s=le.renew_deadline_s,
            retry_period_s=le.retry_period_s,
            request_timeout_s=min(c.request_timeout_s, le.retry_period_s * 2),
        )
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"kubernetes: {exc}") from exc
    if not (opts.pod_discovery.enabled or le.enabled):
        return KubernetesPieces(None, None)
    api = make_api_client(client_cfg)
    return KubernetesPieces(
        PodDiscovery(api, disc_cfg) if opts.pod_discovery.enabled else None,
        LeaseElector(api, le_cfg) if le.enabled else None,
    )
