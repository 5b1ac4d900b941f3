"""``fpm-worker``: vLLM's OpenAI-compatible server with the FPM shim, registered with the planner's discovery.

::

    fpm-worker --model M [any vllm serve flag ...] --worker-id W [--role agg] [--service S]
               (--register-url URL [--register-token-file F] | --register-file workers.yaml)
               [--restore] [--sync-timeout-s 30] [--lease-ttl-s 30] [--advertise-host H]
               [--relay-nats-url URL --relay-namespace NS [--relay-user U] [--relay-password-file F]
                [--relay-arg=--flag ...]]

1. Starts the engine (vLLM's ``AsyncLLM``) with ``worker_shim.InstrumentedScheduler`` (or the async variant when
   vLLM turns async scheduling on) unless ``--scheduler-cls`` names another class. The engine processes get the
   ``FPM_*`` environment; with ``--restore`` they get no ``FPM_WORKER_ID`` (as when the engine was snapshotted
   before its worker had an id) and the id is pushed to every DP rank with :func:`worker_shim.sync_worker_id`.
   If that fails the engine is shut down and the launcher exits with status 3 **without registering**.
2. Registers the worker: ``PUT {url}/v1/workers/{id}`` (renewed every ``ttl/3``) or its entry in a static
   workers file. Its FPM endpoints are ``tcp://{advertise_host}:{FPM_PORT_BASE + rank}``.
3. With ``--relay-nats-url`` (or ``$FPM_RELAY_NATS_URL``), runs the NATS relay (``python -m worker_shim.relay``)
   as a child process for every DP rank, restarted with backoff if it dies, stopped with the engine
   (:mod:`worker_shim.relay_supervisor`): a worker pod needs no relay sidecar. The relay never takes the engine
   down.
4. Serves the OpenAI API until SIGTERM/SIGINT, then deregisters.

Exit status: 0 after a clean shutdown, 2 for bad arguments or configuration, 3 when the id sync fails, 4 when
registration fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from planner.discovery import EngineCapacity, Role, WorkerRecord
from planner.errors import ConfigError, DiscoveryError, PlannerError
from worker_shim.config import ENV_WORKER_ID, ShimConfig
from worker_shim.identity import WorkerIdSyncError, sync_worker_id
from worker_shim.registration import ApiRegistrar, Registrar, StaticFileRegistrar
from worker_shim.relay_supervisor import RelaySettings, RelaySupervisor, add_relay_arguments, relay_settings_from_args

__all__ = ["EXIT_BAD_CONFIG", "EXIT_REGISTER_FAILED", "EXIT_SYNC_FAILED", "LauncherSettings", "main"]

log = logging.getLogger("worker_shim.launcher")

EXIT_BAD_CONFIG = 2
EXIT_SYNC_FAILED = 3
EXIT_REGISTER_FAILED = 4
SHIM_SCHEDULER = "worker_shim.InstrumentedScheduler"
SHIM_ASYNC_SCHEDULER = "worker_shim.InstrumentedAsyncScheduler"


class LauncherSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The launcher's own settings (the vLLM flags are vLLM's), validated by :meth:`from_args`."""

    worker_id: str
    role: Role
    service: str
    restore: bool
    sync_timeout_s: float
    register_url: str | None
    register_token: str
    register_file: Path | None
    lease_ttl_s: float
    advertise_host: str
    shim: ShimConfig
    relay: RelaySettings | None = None  # None: no relay (ZMQ direct, or a sidecar relays)

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str]) -> LauncherSettings:
        shim = ShimConfig.from_env(env)
        worker_id = (args.worker_id or shim.worker_id).strip()
        if not worker_id:
            raise ConfigError(f"--worker-id (or {ENV_WORKER_ID}) is required: the id this worker registers under")
        if args.register_url and args.register_file:
            raise ConfigError("give one of --register-url and --register-file, not both")
        if not args.register_url and not args.register_file:
            raise ConfigError("--register-url (registration API) or --register-file (static workers file) is required")
        token = env.get("FPM_REGISTER_TOKEN", "")
        if args.register_token_file:
            try:
                token = Path(args.register_token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"--register-token-file: cannot read {args.register_token_file}: {exc}") from exc
        if args.register_url and not token:
            raise ConfigError("--register-url needs a token: --register-token-file or FPM_REGISTER_TOKEN")
        if not args.sync_timeout_s > 0:
            raise ConfigError(f"--sync-timeout-s must be > 0, got {args.sync_timeout_s}")
        if not args.lease_ttl_s > 0:
            raise ConfigError(f"--lease-ttl-s must be > 0, got {args.lease_ttl_s}")
        advertise = args.advertise_host or (shim.bind_host if shim.bind_host not in ("*", "0.0.0.0") else "")
        service = args.service or _default_service(args)
        relay = relay_settings_from_args(
            args,
            env,
            service=service,
            worker_id=worker_id,
            host=shim.bind_host if shim.bind_host not in ("*", "0.0.0.0") else "127.0.0.1",
            port_base=shim.port_base,
            curve=bool(shim.curve_secret_key_file),
        )
        return cls(
            worker_id=worker_id,
            role=Role(args.role),
            service=service,
            restore=args.restore,
            sync_timeout_s=args.sync_timeout_s,
            register_url=args.register_url,
            register_token=token,
            register_file=Path(args.register_file) if args.register_file else None,
            lease_ttl_s=args.lease_ttl_s,
            advertise_host=advertise or socket.getfqdn(),
            shim=msgspec.structs.replace(shim, worker_id=worker_id),
            relay=relay,
        )

    def engine_env(self) -> dict[str, str]:
        """``FPM_*`` for the engine processes; a restore leaves the id out."""
        env = self.shim.to_env()
        if self.restore:
            del env[ENV_WORKER_ID]
        return env

    def endpoints(self, dp_size: int) -> tuple[str, ...]:
        return tuple(f"tcp://{self.advertise_host}:{self.shim.port_base + rank}" for rank in range(dp_size))

    def registrar(self) -> Registrar:
        if self.register_url:
            return ApiRegistrar(self.register_url, self.register_token, ttl_s=self.lease_ttl_s)
        assert self.register_file is not None  # from_args guarantees one of the two
        return StaticFileRegistrar(self.register_file)


def _default_service(args: argparse.Namespace) -> str:
    names = getattr(args, "served_model_name", None)
    if isinstance(names, list | tuple) and names:
        return str(names[0])
    return str(getattr(args, "model", "") or "")


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fpm-worker")
    group.add_argument("--worker-id", default="", help=f"registered worker id (default: ${ENV_WORKER_ID})")
    group.add_argument(
        "--role",
        choices=[r.value for r in Role],
        default=Role.AGG.value,
        help="the worker's role in the service (default: agg)",
    )
    group.add_argument("--service", default="", help="service name (default: the served model name)")
    group.add_argument(
        "--restore",
        action="store_true",
        help="start the engine without an id and push it to every DP rank before registering",
    )
    group.add_argument(
        "--sync-timeout-s", type=float, default=30.0, help="--restore: wait this long for the id sync (default: 30)"
    )
    group.add_argument("--register-url", default="", help="planner registration API base URL")
    group.add_argument("--register-token-file", default="", help="file holding the API token ($FPM_REGISTER_TOKEN)")
    group.add_argument("--register-file", default="", help="static workers YAML file to keep this worker in")
    group.add_argument(
        "--lease-ttl-s", type=float, default=30.0, help="registration lease, renewed every ttl/3 (default: 30)"
    )
    group.add_argument(
        "--advertise-host", default="", help="host the planner reaches the FPM ports on (default: this host's FQDN)"
    )
    add_relay_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="fpm-worker", description=__doc__.split("\n\n")[0]))  # type: ignore[no-untyped-call]
    add_launcher_arguments(parser)
    return parser


def _capacity(vllm_config: Any) -> EngineCapacity:
    cache = vllm_config.cache_config
    blocks = int(getattr(cache, "num_gpu_blocks", 0) or 0)
    return EngineCapacity(
        max_num_batched_tokens=int(vllm_config.scheduler_config.max_num_batched_tokens),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        max_model_len=int(vllm_config.model_config.max_model_len),
        kv_capacity_tokens=blocks * int(cache.block_size or 0),
    )


async def _renew(registrar: Registrar, record: WorkerRecord, period_s: float) -> None:
    while True:
        await asyncio.sleep(period_s)
        try:
            await asyncio.to_thread(registrar.register, record)
        except PlannerError as exc:  # keep serving; the next renewal may get through
            log.warning("lease renewal for %s failed: %s", record.worker_id, exc)


async def _run(args: argparse.Namespace, settings: LauncherSettings) -> int:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.entry import build_and_serve
    from vllm.entrypoints.launchers.launcher import setup_server
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    listen_address, sock = setup_server(args, reuse_port=False)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    sched = vllm_config.scheduler_config
    if sched.scheduler_cls is None:
        sched.scheduler_cls = SHIM_ASYNC_SCHEDULER if sched.async_scheduling else SHIM_SCHEDULER
    elif not str(sched.scheduler_cls).startswith("worker_shim."):
        log.warning("--scheduler-cls %s is not the FPM shim's: this engine publishes no FPM", sched.scheduler_cls)
    for key in ("FPM_WORKER_ID", "FPM_PORT_BASE", "FPM_BIND_HOST", "FPM_HEARTBEAT_INTERVAL_S"):
        os.environ.pop(key, None)
    os.environ.update(settings.engine_env())  # inherited by the engine processes started next

    llm = AsyncLLM.from_vllm_config(
        vllm_config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=engine_args.enable_log_requests,
        disable_log_stats=engine_args.disable_log_stats,
    )
    renewal: asyncio.Task[None] | None = None
    registrar: Registrar | None = None
    relay: RelaySupervisor | None = None
    try:
        dp_size = int(vllm_config.parallel_config.data_parallel_size)
        if settings.relay is not None:
            relay = RelaySupervisor(settings.relay, dp_size).start()
            print(
                f"fpm-worker: relaying FPM of {dp_size} rank(s) to NATS {list(settings.relay.nats_urls)}",
                file=sys.stderr,
                flush=True,
            )
        if settings.restore:
            try:
                ranks = await sync_worker_id(llm.engine_core, settings.worker_id, settings.sync_timeout_s)
            except (WorkerIdSyncError, ConfigError) as exc:
                print(
                    f"fpm-worker: identity sync failed, shutting the engine down, not registering: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_SYNC_FAILED
            log.warning("worker id %r synced on DP ranks %s", settings.worker_id, list(ranks))
        record = WorkerRecord(
            worker_id=settings.worker_id,
            role=settings.role,
            service=settings.service,
            dp_size=dp_size,
            fpm_endpoints=settings.endpoints(dp_size),
            capacity=_capacity(llm.vllm_config),
        )
        registrar = settings.registrar()
        try:
            await asyncio.to_thread(registrar.register, record)
        except (PlannerError, ValueError) as exc:
            registrar = None
            print(f"fpm-worker: registration failed, shutting the engine down: {exc}", file=sys.stderr, flush=True)
            return EXIT_REGISTER_FAILED
        print(
            f"fpm-worker: registered {settings.worker_id} endpoints={list(record.fpm_endpoints)}",
            file=sys.stderr,
            flush=True,
        )
        if isinstance(registrar, ApiRegistrar):
            renewal = asyncio.create_task(_renew(registrar, record, settings.lease_ttl_s / 3))
        shutdown = await build_and_serve(llm, listen_address, sock, args)
        await shutdown
        return 0
    finally:
        if renewal is not None:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
        if registrar is not None:
            try:
                await asyncio.to_thread(registrar.deregister, settings.worker_id)
                print(f"fpm-worker: deregistered {settings.worker_id}", file=sys.stderr, flush=True)
            except (PlannerError, OSError) as exc:
                print(f"fpm-worker: deregistration failed: {exc}", file=sys.stderr, flush=True)
        if relay is not None:
            relay.close()
        llm.shutdown()
        sock.close()


VLLM_HELP = "--help=vllm"


def own_parser() -> argparse.ArgumentParser:
    """The launcher's own flags only: ``fpm-worker --help`` prints this without importing vLLM."""
    parser = argparse.ArgumentParser(
        prog="fpm-worker",
        usage="fpm-worker --model M --worker-id W (--register-url URL | --register-file F) [options] "
        "[vllm serve flags]",
        description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog=f"Every other flag is vLLM's (`vllm serve`): `fpm-worker {VLLM_HELP}` lists them "
        "(`--help=all` or `--help=<group>` are passed to vLLM as they are).",
    )
    add_launcher_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        own_parser().print_help()
        return 0
    if VLLM_HELP in argv:  # vLLM's own usage (imports vLLM: takes seconds)
        argv = [a if a != VLLM_HELP else "--help" for a in argv]
    # Check the launcher's own flags before importing vLLM (which takes seconds), so a bad one fails fast.
    own = argparse.ArgumentParser(add_help=False)
    add_launcher_arguments(own)
    own.add_argument("--model", default="")  # vLLM's, read here for the default service name only
    own.add_argument("--served-model-name", nargs="+", default=None)
    early, _ = own.parse_known_args(argv)
    wants_help = any(a == "--help" or a.startswith("--help=") for a in argv)
    try:
        if not wants_help:
            LauncherSettings.from_args(early, os.environ)
    except (ConfigError, DiscoveryError, ValueError) as exc:
        print(f"fpm-worker: {exc} (fpm-worker --help lists the flags)", file=sys.stderr)
        return EXIT_BAD_CONFIG
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = LauncherSettings.from_args(args, os.environ)
    except (ConfigError, DiscoveryError, ValueError) as exc:
        print(f"fpm-worker: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    validate_parsed_serve_args(args)
    return asyncio.run(_run(args, settings))


if __name__ == "__main__":
    raise SystemExit(main())
