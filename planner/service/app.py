"""The planner's HTTP API (FastAPI). Every handler reads or asks the runner; none reads the clock itself.

Errors: a body past ``http.max_body_bytes`` is a 413 (before authentication and parsing); a body with an
unknown field or malformed JSON is a 400; a value that does not validate is a 422; a mutating call without a
known bearer token is a 401, with a token whose role does not allow it a 403 (403 also when no token allowing
it is configured at all: those mutations are then disabled). Credentials: planner.service.auth. See
docs/service.md for the whole API.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, Literal

import msgspec
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field

from planner.discovery import EngineCapacity, Role
from planner.errors import ConfigError, LeaseError, PlannerError
from planner.service.auth import Principal, TokenRole
from planner.service.deadline import Busy, DeadlineMissed
from planner.service.limits import BodyLimitMiddleware
from planner.service.metrics import CONTENT_TYPE_LATEST
from planner.service.operations import role_targets
from planner.service.operations_api import install_operations_api
from planner.service.runner import EndpointConflictError, PlannerRunner
from planner.service.schemas import (
    BoundsResponse,
    DecisionsResponse,
    ExplainResponse,
    OutcomesResponse,
    WhatIfResponse,
    WorkersResponse,
    install_schemas,
    response,
)

__all__ = ["create_app"]

log = logging.getLogger(__name__)

_bearer = HTTPBearer(
    auto_error=False,
    description="A named token: operator (FPM_PLANNER_TOKEN or the tokens file), worker (registration only) or read",
)
WorkerId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:@+=~-]*$",
        description="The worker's registered id (the id its FPM samples carry)",
    ),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapacityBody(_Strict):
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=1 << 30)
    max_num_seqs: int = Field(default=256, ge=1, le=1 << 30)
    max_model_len: int = Field(default=8192, ge=1, le=1 << 30)
    kv_capacity_tokens: int = Field(default=0, ge=0, le=1 << 40, description="0 = unknown")


class RegistrationBody(_Strict):
    role: Role
    service: str = Field(min_length=1, max_length=253)
    dp_size: int = Field(default=1, ge=1, le=1024)
    fpm_endpoints: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        description="One ZMQ endpoint per data-parallel rank, index = rank", min_length=1, max_length=1024
    )
    capacity: CapacityBody = Field(default_factory=CapacityBody)
    ttl_s: float | None = Field(None, gt=0, description="Lease length; renew by PUT again before it lapses")


class RegistrationResponse(BaseModel):
    worker_id: str
    expires_at_s: float = Field(description="When the lease lapses, Unix seconds")


class DeregistrationResponse(BaseModel):
    worker_id: str
    deregistered: bool


class Health(BaseModel):
    status: Literal["ok", "starting", "failing"]
    detail: str = ""


class RoleBoundsPatch(_Strict):
    min_replicas: int | None = Field(None, ge=0, le=100_000, description="null or absent: unchanged")
    max_replicas: int | None = Field(None, ge=0, le=100_000, description="null or absent: unchanged")


class BoundsPatch(_Strict):
    roles: dict[Role, RoleBoundsPatch] = Field(default_factory=dict)
    max_total_gpus: int | None = Field(
        None, ge=0, le=10_000_000, description="GPU budget over every role; null = unlimited"
    )


class WhatIfRole(_Strict):
    """For one role: traffic (replaces what is known), load (replaces the measured load; fields left out keep
    theirs), a scale factor on the measured load, and SLA targets."""

    request_rate_per_s: float | None = Field(None, ge=0, le=1e9)
    isl_tokens: float | None = Field(None, ge=0, le=1e9)
    osl_tokens: float | None = Field(None, ge=0, le=1e9)
    queued_prefill_tokens: float | None = Field(None, ge=0, le=1e12)
    scheduled_prefill_tokens: float | None = Field(None, ge=0, le=1e12)
    decode_requests: float | None = Field(None, ge=0, le=1e12)
    queued_decode_requests: float | None = Field(None, ge=0, le=1e12)
    decode_kv_tokens: float | None = Field(None, ge=0, le=1e15)
    load_scale: float | None = Field(None, ge=0, le=1e6, description="multiply the measured load by this")
    ttft_ms: float | None = Field(None, gt=0, le=1e7)
    itl_ms: float | None = Field(None, gt=0, le=1e7)


class WhatIfBody(_Strict):
    roles: dict[Role, WhatIfRole] = Field(default_factory=dict)


def _json(data: Any, status_code: int = 200) -> Response:
    return Response(msgspec.json.encode(data), status_code=status_code, media_type="application/json")


def create_app(runner: PlannerRunner, *, manage_runner: bool = True) -> FastAPI:
    """The app for ``runner``. With ``manage_runner`` the app's lifespan starts and stops the runner."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        _warn_disabled(runner)
        if manage_runner:
            await runner.start()
        try:
            yield
        finally:
            if manage_runner:
                await runner.stop()

    app = FastAPIOffline(  # Swagger UI / ReDoc from the fastapi-offline package's files: /docs works air-gapped
        title="fpm-planner",
        version="1",
        description="Metrics-driven autoscaling planner for vLLM fleets: decisions, what-if, bounds, worker "
        "registration and operator diagnostics.",
        lifespan=lifespan,
    )

    install_schemas(app)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=runner.config.http.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        bad_request = any(e.get("type") in ("extra_forbidden", "json_invalid") for e in errors)
        detail = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in errors
        ]
        return JSONResponse({"detail": detail}, status_code=400 if bad_request else 422)

    @app.exception_handler(PlannerError)
    async def _planner_error(_: Request, exc: PlannerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    def allow(needed: TokenRole) -> Any:
        """A dependency resolving the request's token into its Principal (also on ``request.state.principal``)
        and refusing a role that does not allow ``needed``."""

        def dependency(
            request: Request,
            credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        ) -> Principal:
            known = runner.credentials
            if not known.has(needed):
                raise HTTPException(
                    403,
                    f"this mutation is disabled: no {needed.value} token is configured "
                    "(FPM_PLANNER_TOKEN, FPM_PLANNER_WORKER_TOKEN or auth.tokens_file)",
                )
            principal = None
            if credentials is not None and credentials.scheme.lower() == "bearer":
                principal = known.resolve(credentials.credentials)
            if principal is None:
                raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
            if not principal.allows(needed):
                role = principal.role.value
                raise HTTPException(
                    403, f"credential {principal.name!r} ({role}) may not do this: {needed.value} needed"
                )
            request.state.principal = principal
            return principal

        return Depends(dependency)

    as_worker = [allow(TokenRole.WORKER)]
    as_operator = [allow(TokenRole.OPERATOR)]

    # -- health ------------------------------------------------------------------------------------------

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Response:
        if not runner.running:
            return _json(
                {"status": "failing", "detail": runner.last_tick_error or "the planner loops are not running"}, 503
            )
        return _json({"status": "ok", "detail": ""})

    @app.get("/readyz", response_model=Health, tags=["health"])
    async def readyz() -> Response:
        if runner.ready:
            return _json({"status": "ok", "detail": ""})
        return _json({"status": "starting", "detail": "no decision tick completed yet"}, 503)

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics() -> Response:
        return Response(runner.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # -- workers -----------------------------------------------------------------------------------------

    @app.get("/v1/workers", tags=["workers"], responses=response(WorkersResponse))
    async def list_workers() -> Response:
        return _json(runner.worker_views())

    @app.put(
        "/v1/workers/{worker_id}",
        response_model=RegistrationResponse,
        tags=["workers"],
        dependencies=as_worker,
        responses={401: {"description": "missing or wrong token"}, 409: {"description": "endpoint taken"}},
    )
    async def register_worker(worker_id: WorkerId, body: RegistrationBody, request: Request) -> Response:
        try:
            registration = runner.register(
                worker_id,
                role=body.role,
                service=body.service,
                dp_size=body.dp_size,
                fpm_endpoints=tuple(body.fpm_endpoints),
                capacity=EngineCapacity(**body.capacity.model_dump()),
                ttl_s=body.ttl_s,
                who=request.state.principal.name,
            )
        except EndpointConflictError as exc:
            raise HTTPException(409, str(exc)) from exc
        except LeaseError as exc:
            raise HTTPException(422, str(exc)) from exc
        return _json(registration)

    @app.delete(
        "/v1/workers/{worker_id}",
        response_model=DeregistrationResponse,
        tags=["workers"],
        dependencies=as_worker,
        responses={401: {"description": "missing or wrong token"}, 404: {"description": "not registered"}},
    )
    async def deregister_worker(worker_id: WorkerId, request: Request) -> Response:
        if not runner.deregister(worker_id, who=request.state.principal.name):
            raise HTTPException(404, f"worker {worker_id!r} is not registered (or its lease lapsed)")
        return _json({"worker_id": worker_id, "deregistered": True})

    # -- decisions ---------------------------------------------------------------------------------------

    @app.get("/v1/decisions/latest", tags=["decisions"], responses=response(DecisionsResponse))
    async def latest_decisions() -> Response:
        return _json(DecisionsResponse(decisions=runner.history.latest()))

    @app.get("/v1/decisions", tags=["decisions"], responses=response(DecisionsResponse))
    async def list_decisions(
        role: Annotated[Role | None, Query(description="only this role")] = None,
        since: Annotated[float | None, Query(description="only decisions made after this Unix time (s)")] = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 100,
    ) -> Response:
        entries = runner.history.decisions(role=None if role is None else role.value, since_s=since, limit=limit)
        return _json(DecisionsResponse(decisions=entries))

    @app.get(
        "/v1/decisions/{decision_id}/explain",
        tags=["decisions"],
        responses={**response(ExplainResponse), 404: {"description": "unknown"}},
    )
    async def explain_decision(decision_id: Annotated[int, Path(ge=1)]) -> Response:
        entry = runner.history.decision(decision_id)
        if entry is None:
            raise HTTPException(404, f"decision {decision_id} is unknown (or older than the history keeps)")
        return _json(runner.explain(entry))

    @app.get("/v1/outcomes", tags=["decisions"], responses=response(OutcomesResponse))
    async def list_outcomes(limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
        return _json(OutcomesResponse(outcomes=runner.history.outcomes(limit)))

    @app.post(
        "/v1/what-if",
        tags=["decisions"],
        responses={
            **response(WhatIfResponse),
            503: {"description": "every what-if slot is busy"},
            504: {"description": "no answer within what_if_deadline_s"},
        },
    )
    async def what_if(body: WhatIfBody) -> Response:
        try:
            result = await runner.what_if(body.model_dump(exclude_none=True))
        except ConfigError as exc:
            raise HTTPException(422, str(exc)) from exc
        except Busy as exc:
            raise HTTPException(503, f"{exc}; try again later", headers={"Retry-After": "5"}) from exc
        except DeadlineMissed as exc:
            raise HTTPException(504, f"the what-if did not finish in time: {exc}") from exc
        return _json(result)

    # -- bounds ------------------------------------------------------------------------------------------

    @app.get("/v1/bounds", tags=["bounds"], responses=response(BoundsResponse))
    async def get_bounds() -> Response:
        return _json(runner.bounds())

    @app.patch(
        "/v1/bounds",
        tags=["bounds"],
        dependencies=as_operator,
        responses={**response(BoundsResponse), 401: {"description": "missing or wrong token"}},
    )
    async def patch_bounds(body: BoundsPatch, request: Request) -> Response:
        try:
            result = runner.patch_bounds(body.model_dump(exclude_unset=True), who=request.state.principal.name)
        except ConfigError as exc:
            raise HTTPException(422, str(exc)) from exc
        return _json(result)

    install_operations_api(  # POST /v1/pause, /v1/resume; GET /v1/pause, /v1/audit
        app,
        runner.operations,
        as_operator=as_operator,
        services=lambda: runner.decider.last_decisions.keys(),
        targets=lambda: role_targets(runner.decider.core_config),
    )

    # -- diagnostics -------------------------------------------------------------------------------------

    @app.get("/v1/diagnostics", tags=["diagnostics"])
    async def diagnostics() -> Response:
        return _json(runner.diagnostics())

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/diagnostics")

    @app.get("/diagnostics", include_in_schema=False, response_class=HTMLResponse)
    async def diagnostics_page() -> HTMLResponse:
        return HTMLResponse(_PAGE)

    return app


def _warn_disabled(runner: PlannerRunner) -> None:
    """Say loudly at start which mutations no configured credential allows."""
    known = runner.credentials
    if not known.has(TokenRole.WORKER):
        log.warning(
            "MUTATIONS DISABLED: no operator or worker token is configured (FPM_PLANNER_TOKEN, "
            "FPM_PLANNER_WORKER_TOKEN or auth.tokens_file): worker registration and PATCH /v1/bounds answer 403"
        )
    elif not known.has(TokenRole.OPERATOR):
        log.warning(
            "OPERATOR MUTATIONS DISABLED: no operator token is configured (FPM_PLANNER_TOKEN or auth.tokens_file): "
            "PATCH /v1/bounds answers 403"
        )
    names = ", ".join(f"{p.name} ({p.role.value})" for p in known.principals)
    log.info("credentials: %s", names or "none")


_PAGE = resources.files("planner.service").joinpath("static/diagnostics.html").read_text(encoding="utf-8")
