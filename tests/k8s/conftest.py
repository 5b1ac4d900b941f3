"""Fixtures for the Kubernetes tests: a fresh API emulator per test and clients pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as k8s

from planner.k8s.client import KubeClientConfig, make_api_client
from tests.fakes.k8s_api import K8sApiEmulator
from tests.k8s.k8s_support import FakeSleep


@pytest.fixture
def emulator() -> Iterator[K8sApiEmulator]:
    with K8sApiEmulator(adapter_controller=True) as emu:
        yield emu


@pytest.fixture
def make_client(emulator: K8sApiEmulator) -> Iterator[Callable[..., k8s.ApiClient]]:
    clients: list[k8s.ApiClient] = []

    def make(user_agent: str = "fpm-planner-test") -> k8s.ApiClient:
        api = make_api_client(KubeClientConfig(host=emulator.url))
        api.user_agent = user_agent
        clients.append(api)
        return api

    yield make
    for api in clients:
        api.close()


@pytest.fixture
def api_client(make_client: Callable[..., k8s.ApiClient]) -> k8s.ApiClient:
    return make_client()


@pytest.fixture
def fake_sleep() -> FakeSleep:
    return FakeSleep()
