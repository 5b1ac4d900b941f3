"""Building the official client's :class:`kubernetes.client.ApiClient` from typed configuration.

The client's own retries are turned off (``retries=False``): urllib3 would otherwise silently retry 429s and
dropped connections, and every attempt must be ours to count, back off and record.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from planner.errors import ConfigError

__all__ = ["KubeClientConfig", "make_api_client"]


class KubeClientConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where the API server is. Exactly one source is used, in this order: ``host`` (a URL, e.g. an emulator
    or ``kubectl proxy``), ``in_cluster`` (the pod's service account), ``kubeconfig`` (a file; None = the
    default ``~/.kube/config``)."""

    host: str | None = None
    in_cluster: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    request_timeout_s: float = 10.0
    verify_ssl: bool = True

    def __post_init__(self) -> None:
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")


def make_api_client(cfg: KubeClientConfig) -> k8s.ApiClient:
    """An ApiClient for ``cfg`` with client-side retries disabled. Raises :class:`ConfigError` when no
    configuration can be loaded."""
    conf = k8s.Configuration()
    try:
        if cfg.host is not None:
            conf.host = cfg.host
        elif cfg.in_cluster:
            k8s_config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        else:
            path = None if cfg.kubeconfig is None else str(Path(cfg.kubeconfig).expanduser())
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=cfg.context, client_configuration=conf
            )
    except (ConfigException, OSError) as exc:
        raise ConfigError(f"kubernetes: cannot load client configuration: {exc}") from exc
    conf.verify_ssl = cfg.verify_ssl if cfg.host is not None else conf.verify_ssl
    conf.retries = False
    return k8s.ApiClient(conf)
