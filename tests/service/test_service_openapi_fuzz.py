"""Property-based run over the published OpenAPI spec (schemathesis): no request, valid or not, with or
without the token, gets a 5xx from a real server."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from tests.service.support import AUTH, Served, make_config, serve

schemathesis = pytest.importorskip("schemathesis")
response_schema_conformance = schemathesis.checks.response_schema_conformance

# /readyz answers 503 until the first tick completes: that is the readiness protocol, not a server error.
EXCLUDED = {("get", "/readyz")}
EXAMPLES_PER_OPERATION = 40


def _fuzz_operation(served: Served, operation: Any, mode: Any) -> list[str]:
    failures: list[str] = []

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=operation.as_strategy(generation_mode=mode), authorized=st.booleans())
    def run(case: Any, authorized: bool) -> None:
        response = case.call(base_url=served.base_url, headers=AUTH if authorized else None, timeout=10)
        where = f"{case.method.upper()} {case.formatted_path} query={case.query} body={case.body!r}"
        if response.status_code >= 500:
            failures.append(f"{where} -> {response.status_code} {response.text[:300]}")
        elif response.status_code == 200:
            try:  # a 200 answer matches the schema the spec publishes for it
                case.validate_response(response, checks=[response_schema_conformance])
            except (AssertionError, BaseExceptionGroup) as exc:  # one Failure, or a FailureGroup of them
                failures.append(f"{where} -> 200 not as published: {str(exc)[:500]}")

    try:
        run()
    except Unsatisfiable:
        # Negative mode on an operation with no parameters or body: nothing can be made invalid.
        if mode != schemathesis.GenerationMode.NEGATIVE:
            raise
    return failures


def test_no_request_over_the_openapi_spec_gets_a_5xx() -> None:
    with serve(make_config()) as served:
        schema = schemathesis.openapi.from_url(f"{served.base_url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 13
        failures: list[str] = []
        for operation in operations:
            if (operation.method.lower(), operation.path) in EXCLUDED:
                continue
            for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
                failures += _fuzz_operation(served, operation, mode)
        assert not failures, "\n".join(failures[:20])
        # The server is still healthy afterwards and kept its state consistent.
        assert served.http.get("/healthz").json()["status"] == "ok"
        assert served.http.get("/v1/diagnostics").status_code == 200
