"""The leader's membership message to the ingest shards (planner.shard.membership): compact, cut into parts under
the server's payload cap, reassembled exactly, never applied out of order, refused when it is not one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from planner.discovery import EngineCapacity, Role, WorkerRecord
from planner.shard.membership import (
    MEMBERSHIP_VERSION,
    Membership,
    MembershipAssembler,
    decode_membership,
    encode_membership,
    membership_due,
    membership_parts,
    membership_subject,
)
from planner.shard.process import summary_wildcard
from planner.shard.summary import ShardSummary


def fleet(n: int, dp: int) -> dict[str, WorkerRecord]:
    return {
        f"worker-{i:05d}": WorkerRecord(
            worker_id=f"worker-{i:05d}",
            role=Role.DECODE if i % 2 else Role.PREFILL,
            service="decode" if i % 2 else "prefill",
            dp_size=dp,
            fpm_endpoints=tuple(f"tcp://10.{i // 250}.{i % 250}.1:{5600 + r}" for r in range(dp)),
            capacity=EngineCapacity(max_num_seqs=128),
        )
        for i in range(n)
    }


def test_a_large_fleet_is_cut_into_parts_under_the_payload_cap_and_reassembled_exactly() -> None:
    workers = fleet(4096, 8)
    parts = membership_parts(leader="p-0", seq=7, taken_at=1000.0, shards=["s1", "s0"], workers=workers)
    assert len(parts) > 1 and max(map(len, parts)) <= 64 * 1024  # nats max_payload on the FPM event plane
    print(f"membership of 4096 workers x 8 ranks: {len(parts)} parts, {sum(map(len, parts))} bytes")
    assembler = MembershipAssembler()
    decoded = [decode_membership(p) for p in parts]
    assert decoded and all(m.version == MEMBERSHIP_VERSION and m.shards == ("s0", "s1") for m in decoded)
    for part in decoded[:-1]:
        assert assembler.add(part) is None  # not complete yet
    complete = assembler.add(decoded[-1])
    assert complete is not None
    got, shards = complete
    assert shards == ("s0", "s1")
    assert set(got) == set(workers)
    for wid, record in workers.items():  # what a shard needs to route and attribute; capacities stay home
        assert (got[wid].role, got[wid].service, got[wid].dp_size, got[wid].fpm_endpoints) == (
            record.role,
            record.service,
            record.dp_size,
            record.fpm_endpoints,
        )


def test_parts_of_an_older_membership_or_an_interleaved_one_are_never_applied() -> None:
    workers = fleet(3, 1)
    assembler = MembershipAssembler()
    new = [
        decode_membership(p) for p in membership_parts(leader="p", seq=2, taken_at=20.0, shards=["s0"], workers=workers)
    ]
    assert assembler.add(new[0]) is not None
    old = decode_membership(membership_parts(leader="p", seq=1, taken_at=10.0, shards=["s0", "s1"], workers={})[0])
    assert assembler.add(old) is None and assembler.refused == 1
    # one part of seq 3, then every part of seq 4: seq 4 applies; seq 3's late parts are refused, never applied
    three, four = (
        [
            decode_membership(p)
            for p in membership_parts(
                leader="p", seq=seq, taken_at=10.0 * seq, shards=[f"s{seq}"], workers=fleet(40, 8), max_part_bytes=512
            )
        ]
        for seq in (3, 4)
    )
    assert len(three) == len(four) > 2
    assert assembler.add(three[0]) is None
    for part in four[:-1]:
        assert assembler.add(part) is None
    complete = assembler.add(four[-1])
    assert complete is not None and complete[1] == ("s4",) and len(complete[0]) == 40
    refused = assembler.refused
    for part in three[1:]:
        assert assembler.add(part) is None
    assert assembler.refused == refused + len(three) - 1


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x01\x02garbage", "not a shard membership"),
        (msgspec.msgpack.encode({"leader": "p", "seq": 1}), "not a shard membership"),
        (
            encode_membership(Membership(version=MEMBERSHIP_VERSION + 1, leader="p", seq=1, taken_at=1.0, shards=())),
            "unsupported shard membership version",
        ),
        (
            encode_membership(Membership(leader="p", seq=1, taken_at=1.0, shards=(), part=3, parts=2)),
            "part 3 of 2",
        ),
    ],
)
def test_a_membership_that_is_not_one_is_refused_with_a_clear_error(payload: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_membership(payload)


def test_the_membership_subject_is_not_a_shard_summary_subject() -> None:
    # fpm-shard.<ns>.* (the leader's summary subscription) matches three tokens; the membership has four
    subject = membership_subject("prod")
    assert subject.startswith("fpm-shard.prod.") and subject.count(".") == 3
    assert summary_wildcard("prod").count(".") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shards", "s0,s1"], "--shards/--shards-file go with --workers-file"),
        (["--workers-file", "workers.yaml"], "--workers-file needs --shards or --shards-file"),
    ],
)
def test_the_shard_process_follows_the_leader_unless_given_a_workers_file_and_its_shards(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "workers.yaml").write_text("workers: []\n")
    cmd = [sys.executable, "-m", "planner.shard", "--shard-id", "s0", "--nats-url", "nats://127.0.0.1:1"]
    cmd += ["--namespace", "prod", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr


def _summary(shard_id: str, workers: tuple[str, ...], taken_at: float) -> ShardSummary:
    return ShardSummary(
        shard_id=shard_id,
        seq=1,
        taken_at=taken_at,
        ttl_s=10.0,
        workers=workers,
        dp_size=(1,) * len(workers),
        fresh=b"\x01" * len(workers),
        load={},
        drops={},
        drops_by_worker={},
        seen={},
        received=0,
    )


def test_the_leader_republishes_only_on_a_change_a_shard_behind_or_the_repeat_interval() -> None:
    owned = {"s0": frozenset({"w0", "w2"}), "s1": frozenset({"w1"})}
    steady = {"s0": _summary("s0", ("w2", "w0"), 101.0), "s1": _summary("s1", ("w1",), 101.0)}

    def due(**kw: object) -> str | None:
        args: dict[str, object] = {
            "now": 102.0,
            "published_at": 100.0,
            "repeat_s": 10.0,
            "workers_changed": False,
            "shards": ["s0", "s1"],
            "published_shards": ("s0", "s1"),
            "owned": owned,
            "summaries": steady,
        }
        args.update(kw)
        return membership_due(**args)  # type: ignore[arg-type]

    assert due() is None  # every live shard reports its partition: nothing to say
    assert due(published_at=None) == "first"
    assert due(workers_changed=True) == "workers_changed"
    assert due(shards=["s0", "s1", "s2"]) == "shards_changed"
    assert due(now=110.0) == "repeat"
    # s1 restarted (or missed a part): its summary since the publish holds nothing
    assert due(summaries={**steady, "s1": _summary("s1", (), 101.5)}) == "shard_behind"
    # a summary taken before the publish may still show the old partition: not a reason
    assert due(summaries={**steady, "s1": _summary("s1", (), 99.0)}) is None
