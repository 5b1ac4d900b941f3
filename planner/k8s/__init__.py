"""Kubernetes plumbing shared by the actuator, pod discovery and leader election: client construction
(:mod:`planner.k8s.client`), the API-error mapping onto the planner's error tree (:mod:`planner.k8s.errors`),
pod discovery (:mod:`planner.k8s.discovery`) and Lease leader election (:mod:`planner.k8s.leader`).

Everything here blocks (the official client is synchronous); the service runner calls it from threads.
"""

__all__: list[str] = []
