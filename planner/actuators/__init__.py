"""Actuators: apply the planner's decisions. ``base`` holds the protocol and records (import it directly);
``advisory`` records without writing; ``kubernetes`` scales DynamoGraphDeployments and apps/v1 workloads."""

__all__: list[str] = []
