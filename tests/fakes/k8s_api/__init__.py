"""Kubernetes API emulator for the tests: a real HTTP server speaking the REST subset the official client
uses."""

from tests.fakes.k8s_api.server import Fault, K8sApiEmulator, ResourceType

__all__ = ["Fault", "K8sApiEmulator", "ResourceType"]
