"""``python -m planner.shard``: one ingest shard process.

::

    python -m planner.shard --shard-id ID --nats-url URL --namespace NS [--workers-from-leader]
        [--summary-interval-s 1] [--ttl-s 10] [--user U]
    python -m planner.shard --shard-id ID --nats-url URL --namespace NS --workers-file workers.yaml
        (--shards ID1,ID2,... | --shards-file FILE) [...]
        # password: $FPM_NATS_PASSWORD

Following the leader (the default: no ``--workers-file``): the planner service's leader (``ingest.shards``)
publishes the workers its discovery found and the live shard set (the shards whose summaries it hears fresh) on
``fpm-shard.<ns>.membership.v1`` (:mod:`planner.shard.membership`); the shard applies each complete membership as
it arrives (:meth:`IngestShard.follow`: its rendezvous partition, subscribed as per-worker subjects; nothing
while it is not in the live set yet). A new shard therefore owns nothing until the leader has heard its first
(empty) summary; a shard that stops is dropped from the live set once its summary is ``max_summary_age_s`` old,
and its workers go to the others. No membership yet, or the leader gone: it keeps what it has.

From a file (``--workers-file``): every ``--summary-interval-s`` it reads the workers (a static workers file,
re-read when it changes) and the shard set (``--shards``, or a file of one shard id per line, re-read when it
changes: shards come and go by editing it, e.g. a ConfigMap) and follows them.

Either way it publishes its summary on ``fpm-shard.<ns>.<shard_id>`` every ``--summary-interval-s``.

Following the leader, the membership also carries the planner's settings a shard must share: its FPM limits
(``ingest.limits``, applied to the shard's store as they arrive: a sample the planner would refuse as
``invalid_value`` is refused by the shard too) and the fleet-wide rate of perf-model training points, of which the
shard forwards its share after every summary on ``fpm-shard.<ns>.perf.v1.<shard_id>``
(:mod:`planner.shard.perf_points`). From a file there is no leader to follow: the default limits, no points.
SIGTERM/SIGINT stop it. Exit status 2 for bad arguments or a file that cannot be read at start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from planner.discovery import StaticFileDiscovery, WorkerRecord
from planner.errors import DiscoveryError
from planner.ingest.drops import FpmLimits
from planner.shard.perf_points import PointPicker, encode_perf_points, perf_points_subject
from planner.shard.process import IngestShard, MembershipFollower

__all__ = ["main"]

log = logging.getLogger("planner.shard")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m planner.shard", description="one FPM ingest shard on NATS")
    parser.add_argument("--shard-id", required=True)
    shards = parser.add_mutually_exclusive_group()
    shards.add_argument("--shards", help="with --workers-file: every shard id, comma-separated (this one included)")
    shards.add_argument("--shards-file", help="with --workers-file: a file of shard ids, one per line, re-read")
    parser.add_argument("--nats-url", action="append", required=True, help="NATS server URL (repeatable)")
    parser.add_argument("--namespace", required=True)
    workers = parser.add_mutually_exclusive_group()
    workers.add_argument("--workers-file", help="YAML workers file (planner.discovery), instead of the leader's")
    workers.add_argument(
        "--workers-from-leader",
        action="store_true",
        help="follow the workers and shard set the planner's leader publishes (the default without --workers-file)",
    )
    parser.add_argument("--user", default=None, help="NATS user (default: the shard id)")
    parser.add_argument("--summary-interval-s", type=float, default=1.0)
    parser.add_argument("--ttl-s", type=float, default=10.0)
    return parser


def _read_shards(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)
    environ = os.environ if env is None else env
    if args.summary_interval_s <= 0 or args.ttl_s <= 0:
        print("python -m planner.shard: --summary-interval-s and --ttl-s must be > 0", file=sys.stderr)
        return 2
    if args.workers_file is None:
        if args.shards or args.shards_file:
            print(
                "python -m planner.shard: --shards/--shards-file go with --workers-file"
                " (following the leader, the leader names the live shards)",
                file=sys.stderr,
            )
            return 2
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return _follow_leader(args, environ)
    if not (args.shards or args.shards_file):
        print("python -m planner.shard: --workers-file needs --shards or --shards-file", file=sys.stderr)
        return 2
    shards_file = Path(args.shards_file) if args.shards_file else None
    try:
        discovery = StaticFileDiscovery(args.workers_file)
        shard_ids = _read_shards(shards_file) if shards_file else [s.strip() for s in args.shards.split(",")]
    except (OSError, DiscoveryError) as exc:
        print(f"python -m planner.shard: {exc}", file=sys.stderr)
        return 2
    if args.shard_id not in shard_ids:
        print(f"python -m planner.shard: {args.shard_id!r} is not among the shards {shard_ids}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    shard = _shard(args, environ)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    last: tuple[Mapping[str, WorkerRecord], list[str]] | None = None
    shard.start()
    try:
        while not stop.is_set():
            workers = discovery.workers(time.monotonic())
            if shards_file is not None:
                try:
                    shard_ids = _read_shards(shards_file)
                except OSError as exc:
                    log.warning("cannot read %s, keeping the shard set %s: %s", shards_file, shard_ids, exc)
            if last is None or workers is not last[0] or shard_ids != last[1]:
                if args.shard_id in shard_ids:
                    shard.set_membership(workers, shard_ids)
                    log.info("shard %s owns %d of %d workers", args.shard_id, len(shard.owned), len(workers))
                else:
                    log.warning("%r is not in the shard set %s: keeping its partition", args.shard_id, shard_ids)
                last = (workers, list(shard_ids))
            shard.publish_summary()
            stop.wait(args.summary_interval_s)
    finally:
        shard.close()
    return 0


def _shard(args: argparse.Namespace, environ: Mapping[str, str]) -> IngestShard:
    return IngestShard(
        args.shard_id,
        servers=args.nats_url,
        namespace=args.namespace,
        user=args.user or args.shard_id,
        password=environ.get("FPM_NATS_PASSWORD") or None,
        ttl_s=args.ttl_s,
    )


def _follow_leader(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Apply each complete membership as it arrives; publish the summary every interval."""
    shard = _shard(args, environ)
    follower = MembershipFollower(
        servers=args.nats_url,
        namespace=args.namespace,
        user=args.user or args.shard_id,
        password=environ.get("FPM_NATS_PASSWORD") or None,
    )
    stop = threading.Event()

    def stopping(*_: object) -> None:
        stop.set()
        follower.arrived.set()  # wake the loop

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping)
    shard.start()
    follower.start()
    next_summary_at = time.monotonic()
    applied: tuple[dict[str, WorkerRecord], tuple[str, ...]] | None = None
    forwarder = _PointForwarder(shard)
    try:
        while not stop.is_set():
            membership = follower.take()
            if membership is not None:
                with follower.lock:  # the settings of the newest complete membership
                    limits, forwarder.rate_per_s = follower.assembler.limits, follower.assembler.perf_points_per_s
                _apply_limits(shard, limits)
            if membership is not None and membership != applied:  # the leader repeats itself every second
                applied = membership
                workers, shard_ids = membership
                shard.follow(workers, shard_ids)
                forwarder.follow(workers, shard.owned, shard_ids)
                log.info(
                    "shard %s owns %d of %d workers (live shards %s)",
                    args.shard_id,
                    len(shard.owned),
                    len(workers),
                    list(shard_ids),
                )
            now = time.monotonic()
            if now >= next_summary_at:
                shard.publish_summary()
                forwarder.publish(now)
                next_summary_at = now + args.summary_interval_s
            follower.arrived.wait(max(0.0, next_summary_at - time.monotonic()))
    finally:
        follower.close()
        shard.close()
    return 0


def _apply_limits(shard: IngestShard, limits: FpmLimits | None) -> None:
    """The leader's FPM limits on the shard's store (None: the leader sent none: keep them)."""
    if limits is not None and limits != shard.store.limits:
        with shard.source.lock:
            shard.store.set_limits(limits)
        log.info("shard %s checks samples against the planner's limits %s", shard.shard_id, limits)


class _PointForwarder:
    """The shard's share of the leader's perf-model training points, published after every summary."""

    def __init__(self, shard: IngestShard) -> None:
        self.shard = shard
        self.picker = PointPicker()
        self.rate_per_s = 0.0  # the leader's fleet-wide rate (0 until a membership says otherwise)
        self.workers: dict[str, WorkerRecord] = {}  # the shard's own
        self.shards = 1
        self.seq = 0

    def follow(self, workers: Mapping[str, WorkerRecord], owned: Sequence[str], shard_ids: Sequence[str]) -> None:
        self.workers = {wid: workers[wid] for wid in owned}
        self.shards = max(1, len(shard_ids))

    def publish(self, now: float) -> None:
        shard = self.shard
        points = self.picker.pick(
            shard.store, shard.source.lock, self.workers, rate_per_s=self.rate_per_s, shards=self.shards, now=now
        )
        subject = perf_points_subject(shard.namespace, shard.shard_id)
        for payload in encode_perf_points(shard.shard_id, self.seq + 1, points):
            self.seq += 1
            shard.source.publish(subject, payload)


if __name__ == "__main__":
    raise SystemExit(main())
