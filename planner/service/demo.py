"""``fpm-planner demo``: the planner service and a simulated fleet, on this machine, over real sockets.

The simulated engines (planner.sim) publish real FPM over ZMQ on localhost through the foundation's
publisher; a registrar does what each worker's launcher does in production — registers the serving engines
through the planner's HTTP API with a lease, renews it, and deregisters engines that go away; the planner
scales the fleet through the local actuator. The load is a bundled slice of the Azure LLM code trace, replayed
in a loop at ``--speed`` times real time. It prints the diagnostics URL and stops cleanly on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import msgspec
import uvicorn

from planner.actuators.local import LocalActuator
from planner.discovery import WorkerRecord
from planner.errors import PlannerError
from planner.service.app import create_app
from planner.service.config import ActuatorConfig, ActuatorKind, DiscoveryConfig, HttpConfig, ServiceConfig
from planner.service.runner import PlannerRunner
from planner.service.server import GracefulServer
from planner.sim.fleet import FleetConfig, SimFleet, ZmqSink
from planner.sim.realtime import RealtimeReplay
from planner.sim.timing import DEFAULT_PROFILE_DIR, ProfileFitTimer, StepTimer, default_timer
from planner.sim.traces import load_trace, scale_rate

__all__ = ["add_arguments", "demo_core_config", "run"]

log = logging.getLogger(__name__)

# ProfileFitTimer fitted on ../shared/data/profiles/h200_llama31_8b_fp8_tp1 (H200, Llama-3.1-8B FP8), used
# when that directory is not there (a fresh clone): the demo needs nothing outside the package.
_LEASE_TTL_S = 6.0
_REGISTER_INTERVAL_S = 1.0


def demo_core_config(max_replicas: int) -> dict[str, Any]:
    """Decision-core settings for a demo that moves within minutes: HPA-shaped, with short windows."""
    return {
        "roles": {
            "agg": {
                "service": "demo-agg",
                "min_replicas": 1,
                "max_replicas": max_replicas,
                "scale_up": {
                    "stabilization_window_s": 0.0,
                    "policies": [{"kind": "replicas", "value": 2, "period_s": 5.0}],
                },
                "scale_down": {
                    "stabilization_window_s": 20.0,
                    "policies": [{"kind": "replicas", "value": 1, "period_s": 10.0}],
                },
                "pending_timeout_s": 60.0,
            }
        }
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8080, help="HTTP port of the planner (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1)")
    parser.add_argument("--speed", type=float, default=4.0, help="trace time per wall second (default 4)")
    parser.add_argument("--rate-scale", type=float, default=6.0, help="request rate multiplier (default 6)")
    parser.add_argument("--trace", type=Path, help="a trace to replay instead of the bundled one")
    parser.add_argument("--max-replicas", type=int, default=6, help="largest fleet the planner may ask for")
    parser.add_argument("--cold-start-s", type=float, default=30.0, help="replica start-up, trace seconds")
    parser.add_argument("--tick-interval-s", type=float, default=1.0, help="planner tick (default 1 s)")
    parser.add_argument(
        "--token",
        help="operator API token, >= 32 bytes (default: $FPM_PLANNER_TOKEN, else a random one, printed at start)",
    )


def _timer() -> StepTimer:
    if Path(DEFAULT_PROFILE_DIR).is_dir():
        with contextlib.suppress(PlannerError, OSError, ValueError):
            return default_timer()
    return ProfileFitTimer(
        base_s=0.0046741,
        a_p=1.51834e-05,
        a_attn=8.41997e-10,
        a_d=3.49476e-05,
        a_kv=2.92816e-08,
        ttft_overhead_s=0.0118273,
    )


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _registration(record: WorkerRecord) -> dict[str, Any]:
    return {
        "role": record.role.value,
        "service": record.service,
        "dp_size": record.dp_size,
        "fpm_endpoints": list(record.fpm_endpoints),
        "capacity": msgspec.to_builtins(record.capacity),
        "ttl_s": _LEASE_TTL_S,
    }


async def _registrar(base_url: str, token: str, replay: RealtimeReplay) -> None:
    """What each worker's launcher does: register serving engines (lease), renew, deregister departed ones."""
    headers = {"Authorization": f"Bearer {token}"}
    registered: set[str] = set()
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=5.0) as client:
        while True:
            workers = await asyncio.to_thread(replay.workers)
            for worker_id, record in workers.items():
                try:
                    response = await client.put(f"/v1/workers/{worker_id}", json=_registration(record))
                    if response.status_code == 200:
                        registered.add(worker_id)
                    else:
                        log.warning("registering %s: %s %s", worker_id, response.status_code, response.text)
                except httpx.HTTPError as exc:
                    log.warning("registering %s: %s", worker_id, exc)
            for worker_id in sorted(registered - workers.keys()):
                with contextlib.suppress(httpx.HTTPError):
                    await client.delete(f"/v1/workers/{worker_id}")
                registered.discard(worker_id)
            await asyncio.sleep(_REGISTER_INTERVAL_S)


async def _serve(args: argparse.Namespace, sock: socket.socket) -> int:
    given = args.token or os.environ.get("FPM_PLANNER_TOKEN")
    token = given or secrets.token_urlsafe(32)
    trace_path = args.trace or resources.files("planner.service").joinpath("data/demo_trace.csv")
    trace = scale_rate(load_trace(str(trace_path)), args.rate_scale)
    sink = ZmqSink(host="127.0.0.1", heartbeat_interval_s=0.5)
    fleet = SimFleet(
        FleetConfig(cold_start_s=args.cold_start_s, service_prefix="demo", heartbeat_interval_s=0.5),
        _timer(),
        sink=sink,
        name="demo",
    )
    replay = RealtimeReplay(fleet, trace, speed=args.speed, initial_replicas=1)
    config = ServiceConfig(
        http=HttpConfig(host=args.host, port=args.port),
        tick_interval_s=args.tick_interval_s,
        discovery=DiscoveryConfig(default_ttl_s=_LEASE_TTL_S, refresh_interval_s=0.5),
        actuator=ActuatorConfig(kind=ActuatorKind.LOCAL),
        core=demo_core_config(args.max_replicas),
        auth_token=token,
    )
    runner = PlannerRunner(config, actuator=LocalActuator(replay, max_replicas=args.max_replicas))
    server = GracefulServer(uvicorn.Config(create_app(runner), log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    registrar: asyncio.Task[None] | None = None
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if serving.done():
            return 1
        replay.start()
        base_url = f"http://{args.host}:{args.port}"
        registrar = asyncio.create_task(_registrar(base_url, token, replay))
        print(
            f"fpm-planner demo: diagnostics at {base_url}/diagnostics  (API docs {base_url}/docs; Ctrl-C to stop)",
            flush=True,
        )
        shown = "the one given (--token / FPM_PLANNER_TOKEN)" if given else token
        print(
            f"fpm-planner demo: operator token: {shown}\n"
            f"  try: curl -X POST -H 'Authorization: Bearer <token>' {base_url}/v1/pause -d '{{}}' "
            "-H 'Content-Type: application/json'",
            flush=True,
        )
        await serving
    finally:
        if registrar is not None:
            registrar.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await registrar
        await asyncio.to_thread(replay.stop)
        sink.close()
    print("fpm-planner demo: stopped", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 0 < args.port < 65536:
        print(f"fpm-planner demo: --port must be in 1..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"fpm-planner demo: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(_serve(args, sock))
    except PlannerError as exc:
        print(f"fpm-planner demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the server took over the signal: the fleet is stopped already
        print("fpm-planner demo: stopped", flush=True)
        return 0
    finally:
        sock.close()
