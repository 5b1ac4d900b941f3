"""Every message of one publisher run carries its run_id; a new run draws a new one (issue 12, item 9)."""

from __future__ import annotations

import time

import zmq

from worker_shim import fpm
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher


def _read(sub: zmq.Socket[bytes], pub: FpmPublisher, want: int) -> list[fpm.ForwardPassMetrics]:
    got: list[fpm.ForwardPassMetrics] = []
    deadline = time.monotonic() + 20
    # at least ``want`` messages, samples among them: heartbeats every millisecond can fill ``want`` on their own
    # while a loaded machine delays the first sample past the subscription (the slow joiner loses it)
    while len(got) < want or all(m.is_heartbeat for m in got):
        assert time.monotonic() < deadline, "publisher messages not received"
        pub.publish(0.01, ScheduledRequests(num_decode_requests=1), QueuedRequests())
        # heartbeats arrive every millisecond, so drain a bounded batch and publish again
        for _ in range(want):
            if not sub.poll(10):
                break
            got.append(fpm.decode(fpm.parse_frames(sub.recv_multipart())[2]))
    return got


def test_samples_and_heartbeats_carry_the_run_id_drawn_at_start() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        runs = []
        for _ in range(2):
            pub = FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.001, context=ctx)
            assert pub.run_id == 0  # not started yet
            pub.start()
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub.bound_endpoint or "")
            try:
                messages = _read(sub, pub, 40)
                assert {m.run_id for m in messages} == {pub.run_id} and 0 < pub.run_id < 2**64
                assert any(m.is_heartbeat for m in messages) and any(not m.is_heartbeat for m in messages)
                assert pub.stats().run_id == pub.run_id
                runs.append(pub.run_id)
            finally:
                sub.close(linger=0)
                pub.close()
        assert runs[0] != runs[1]
        fixed = FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", context=ctx, run_id=77).start()
        try:
            assert fixed.run_id == 77
        finally:
            fixed.close()
    finally:
        ctx.destroy(linger=0)
