"""The NATS relay as a child of ``fpm-worker``: no sidecar needed in the worker pod.

:class:`RelaySupervisor` runs ``python -m worker_shim.relay`` (its command line, unchanged: ``--nats-url``,
``--namespace``, ``--service``, ``--worker-id``, ``--dp-size``, ``--host``, ``--port-base``, plus any
``--relay-arg`` passed through) for every DP rank of the engine, restarts it with exponential backoff when it exits
on its own, and stops it (SIGTERM, then SIGKILL) when the engine stops. It runs on a daemon thread that catches
everything: a relay that cannot start or keeps dying is logged and retried, never an error of the engine.

The password goes to the child in ``$FPM_NATS_PASSWORD`` (never on its command line, which ``ps`` shows), the user
in ``$FPM_NATS_USER``. What was lost while the relay was down shows up on the planner as a ``counter_id`` gap of each
rank (``gaps`` / ``lost_samples``), as any loss on the FPM path does; :attr:`RelaySupervisor.restarts` counts the
restarts here.

The child dies with ``fpm-worker``, a SIGKILL included (:mod:`worker_shim.parent_watch`: ``$FPM_RELAY_PARENT_PID``
names this process; on Linux the kernel sends the relay SIGTERM when the supervisor's thread, which started it,
ends; elsewhere the relay polls its parent id).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from planner.errors import ConfigError
from worker_shim.parent_watch import ENV_PARENT_PID

__all__ = [
    "ENV_RELAY_NAMESPACE",
    "ENV_RELAY_NATS_URL",
    "RelaySettings",
    "RelaySupervisor",
    "add_relay_arguments",
    "relay_settings_from_args",
]

log = logging.getLogger("worker_shim.relay_supervisor")

ENV_RELAY_NATS_URL = "FPM_RELAY_NATS_URL"  # comma-separated; set: fpm-worker starts the relay
ENV_RELAY_NAMESPACE = "FPM_RELAY_NAMESPACE"
ENV_NATS_USER = "FPM_NATS_USER"
ENV_NATS_PASSWORD = "FPM_NATS_PASSWORD"


class RelaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """What the relay child is started with (``dp_size`` comes from the engine's configuration later)."""

    nats_urls: tuple[str, ...]
    namespace: str
    service: str
    worker_id: str
    user: str | None  # None: the relay's default, the worker id
    password: str | None
    host: str  # where the shim's publishers listen (loopback in a pod)
    port_base: int
    extra_args: tuple[str, ...] = ()

    def command(self, dp_size: int, python: str = sys.executable) -> list[str]:
        cmd = [python, "-m", "worker_shim.relay"]
        for url in self.nats_urls:
            cmd += ["--nats-url", url]
        cmd += ["--namespace", self.namespace, "--service", self.service, "--worker-id", self.worker_id]
        cmd += ["--dp-size", str(dp_size), "--host", self.host, "--port-base", str(self.port_base)]
        return [*cmd, *self.extra_args]

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in (ENV_NATS_USER, ENV_NATS_PASSWORD)}
        if self.user:
            env[ENV_NATS_USER] = self.user
        if self.password:
            env[ENV_NATS_PASSWORD] = self.password
        return env


def add_relay_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fpm-worker: NATS relay (optional; no sidecar needed)")
    group.add_argument(
        "--relay-nats-url",
        action="append",
        default=[],
        help=f"start the FPM relay to this NATS server (repeatable; or ${ENV_RELAY_NATS_URL}, comma-separated)",
    )
    group.add_argument(
        "--relay-namespace", default="", help=f"the <ns> of the relay's subjects (or ${ENV_RELAY_NAMESPACE})"
    )
    group.add_argument("--relay-user", default="", help=f"NATS user (or ${ENV_NATS_USER}; default: the worker id)")
    group.add_argument(
        "--relay-password-file", default="", help=f"file holding the NATS password (or ${ENV_NATS_PASSWORD})"
    )
    group.add_argument(
        "--relay-arg",
        action="append",
        default=[],
        help="one more argument for `python -m worker_shim.relay`, passed as is (repeatable: --relay-arg=--flag)",
    )


def relay_settings_from_args(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    service: str,
    worker_id: str,
    host: str,
    port_base: int,
    curve: bool,
) -> RelaySettings | None:
    """The relay's settings, or None when no NATS URL is given (no relay); :class:`ConfigError` names the flag."""
    urls = [u.strip() for u in args.relay_nats_url if u.strip()]
    if not urls:
        urls = [u.strip() for u in env.get(ENV_RELAY_NATS_URL, "").split(",") if u.strip()]
    if not urls:
        if args.relay_arg or args.relay_namespace or args.relay_user or args.relay_password_file:
            raise ConfigError("--relay-* flags need --relay-nats-url (or $FPM_RELAY_NATS_URL): the relay is off")
        return None
    namespace = (args.relay_namespace or env.get(ENV_RELAY_NAMESPACE, "")).strip()
    if not namespace:
        raise ConfigError(f"--relay-nats-url needs --relay-namespace (or ${ENV_RELAY_NAMESPACE})")
    if not service:
        raise ConfigError("--relay-nats-url needs the service (--service, or --served-model-name / --model)")
    if curve:
        raise ConfigError(
            "--relay-nats-url with FPM_CURVE_SECRET_KEY_FILE: the relay reads the shim over loopback without CURVE;"
            " bind the shim to 127.0.0.1 (FPM_BIND_HOST) and leave CURVE off"
        )
    password = env.get(ENV_NATS_PASSWORD, "") or None
    if args.relay_password_file:
        try:
            password = Path(args.relay_password_file).read_text().strip() or None
        except OSError as exc:
            raise ConfigError(f"--relay-password-file: cannot read {args.relay_password_file}: {exc}") from exc
    return RelaySettings(
        nats_urls=tuple(urls),
        namespace=namespace,
        service=service,
        worker_id=worker_id,
        user=(args.relay_user or env.get(ENV_NATS_USER, "")).strip() or None,
        password=password,
        host=host,
        port_base=port_base,
        extra_args=tuple(args.relay_arg),
    )


class RelaySupervisor:
    """Keeps one relay child running for ``dp_size`` ranks until :meth:`close`.

    A child that exits on its own (crash, kill, bad pass-through flag) is restarted after a backoff that starts at
    ``backoff_initial_s`` and doubles up to ``backoff_max_s``; it falls back to the initial value once a child has
    run for ``stable_s``."""

    def __init__(
        self,
        settings: RelaySettings,
        dp_size: int,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        stable_s: float = 60.0,
        stop_timeout_s: float = 10.0,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        if dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {dp_size}")
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError("backoff: 0 < backoff_initial_s <= backoff_max_s")
        self.settings = settings
        self.dp_size = dp_size
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stable_s = stable_s
        self.stop_timeout_s = stop_timeout_s
        # the child dies with this process (worker_shim.parent_watch): never an orphan after a SIGKILL
        self._env = settings.child_env(os.environ if env is None else env) | {ENV_PARENT_PID: str(os.getpid())}
        self._log_path = log_path
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, name="fpm-relay-supervisor", daemon=True)
        self.starts = 0
        self.restarts = 0
        self.last_exit_code: int | None = None

    @property
    def pid(self) -> int | None:
        """The running child's pid (None between a death and its restart)."""
        with self._lock:
            proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> RelaySupervisor:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop supervising and stop the child: SIGTERM, then SIGKILL after ``stop_timeout_s``."""
        self._stop.set()
        self._thread.join(self.stop_timeout_s + 5)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            self._terminate(proc)

    def __enter__(self) -> RelaySupervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self) -> subprocess.Popen[bytes] | None:
        cmd = self.settings.command(self.dp_size)
        try:
            if self._log_path is not None:
                with self._log_path.open("ab") as out:
                    return subprocess.Popen(cmd, env=self._env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            return subprocess.Popen(cmd, env=self._env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            log.warning("cannot start the FPM relay (%s): %s", cmd[:3], exc)
            return None

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("the FPM relay (pid %d) ignored SIGTERM for %.0f s: killed", proc.pid, self.stop_timeout_s)
            proc.kill()
            proc.wait(5)

    def _supervise(self) -> None:
        backoff_s = self.backoff_initial_s
        while not self._stop.is_set():
            try:
                proc = self._spawn()
                if proc is None:
                    started = time.monotonic()
                else:
                    with self._lock:
                        if self._stop.is_set():  # closed while spawning: close() has already taken _proc
                            self._terminate(proc)
                            return
                        self._proc = proc
                    self.starts += 1
                    if self.starts > 1:
                        self.restarts += 1
                    started = time.monotonic()
                    log.info("FPM relay started (pid %d, %d ranks)", proc.pid, self.dp_size)
                    while not self._stop.is_set() and proc.poll() is None:
                        self._stop.wait(0.2)
                    if self._stop.is_set():
                        return  # close() stops the child
                    self.last_exit_code = proc.returncode
                    with self._lock:
                        self._proc = None
                    log.warning("FPM relay exited with status %s: restarting in %.1f s", proc.returncode, backoff_s)
                if time.monotonic() - started >= self.stable_s:
                    backoff_s = self.backoff_initial_s
                self._stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, self.backoff_max_s)
            except Exception:  # never let the supervisor die: the engine goes on without FPM on NATS meanwhile
                log.exception("FPM relay supervisor")
                self._stop.wait(backoff_s)
