"""``fpm-planner``: the command line. Each subcommand lives in its own module, imported only when used, so
``fpm-planner bench ingest`` does not import vLLM or FastAPI.

A command module provides ``add_arguments(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "ingest": ("planner.bench.ingest", "FPM ingest rate: M publishers over real ZMQ into one subscriber"),
    "tick": ("planner.bench.tick", "decision time per tick for a large fleet"),
    "perf-model": ("perf_model.bench", "perf model accuracy on the measured H200 profile"),
    "shim": ("worker_shim.bench", "worker shim overhead in a real vLLM CPU engine"),
    "replay": ("planner.sim.bench", "replay speed of a one-hour trace"),
    "service": ("planner.service.bench", "planner service: HTTP API and tick with a large registered fleet"),
    "soak": ("planner.bench.soak", "planner service soak: publisher kills, cut connections, malformed messages"),
}
COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("planner.sim.replay_cli", "replay a request trace against the planner and baselines"),
    "serve": ("planner.service.serve_cli", "run the planner service"),
    "demo": ("planner.service.demo", "planner service + simulated fleet on real ZMQ, diagnostics page"),
}


def _attach(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, module: str, help_text: str) -> None:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(_module=module)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            parser.set_defaults(_missing=f"'{name}' is not available in this build ({module} is missing)")
            return
        raise
    mod.add_arguments(parser)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fpm-planner")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fpm-planner", description="Metrics-driven autoscaling planner for vLLM fleets."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks that print one JSON line of figures")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    # Import only the module the command line names; list the others by name.
    wanted = list(argv[:2])
    for name, (module, help_text) in BENCHES.items():
        if wanted[:2] == ["bench", name]:
            _attach(bench_sub, name, module, help_text)
        else:
            bench_sub.add_parser(name, help=help_text)
    for name, (module, help_text) in COMMANDS.items():
        if wanted[:1] == [name]:
            _attach(sub, name, module, help_text)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while a command is still importing: no traceback
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    missing = getattr(args, "_missing", None)
    if missing is not None:
        parser.error(missing)
    module = importlib.import_module(args._module)
    return int(module.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
