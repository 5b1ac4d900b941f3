"""Write the SYNTHETIC engine profile ``synthetic_kv_bound_tp1/`` (prefill.csv, decode.csv) used by the held-out
replay suite's second part. Nothing here was measured: the step times come from the closed forms below.

    python docs/replay-heldout/profiles/make_kv_bound_profile.py docs/replay-heldout/profiles/synthetic_kv_bound_tp1

Decode (ms per step): ``itl = BASE + PER_SEQ * B + PER_KV * K`` with ``B`` sequences decoding and ``K = B *
context`` tokens of KV among them: a KV-bound engine whose decode step is dominated by attention over the TOTAL
KV of the batch (the per-sequence term is small), with no launch-bound floor and a higher per-step constant
(CUDA graphs off: every step pays the kernel launches). Prefill (ms, one prompt alone): ``ttft = C0 + A * isl +
Q * isl**2``, a cheaper linear term and a heavier quadratic (attention) term than the H200 profile's.
The KV capacity is the H200 profile's (the simulated engines' ``EngineConfig.kv_capacity_tokens`` is fixed).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

MAX_KV_TOKENS = 945029
BASE_MS = 10.0
PER_SEQ_MS = 0.01
PER_KV_MS = 1.2e-4
C0_MS = 30.0
A_MS = 0.012
Q_MS = 2.5e-6
CONTEXTS = (350, 1000, 2997, 5644, 8291, 10938, 13585)
KV_FRACTIONS = (0.0005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9)
MAX_BATCH = 512  # like the H200 profile's fit: no point past 512 sequences
ISLS = tuple(range(100, 16373, 1017))


def decode_itl_ms(batch: float, kv_tokens: float) -> float:
    return BASE_MS + PER_SEQ_MS * batch + PER_KV_MS * kv_tokens


def prefill_ttft_ms(isl: float) -> float:
    return C0_MS + A_MS * isl + Q_MS * isl * isl


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "prefill.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["isl_tokens", "ttft_ms", "throughput_tokens_per_s_per_gpu"])
        for isl in ISLS:
            ttft = prefill_ttft_ms(isl)
            w.writerow([isl, f"{ttft:.4f}", f"{isl * 1000.0 / ttft:.2f}"])
    with (out / "decode.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kv_usage_fraction", "context_length_tokens", "itl_ms", "throughput_tokens_per_s_per_gpu"])
        for ctx in CONTEXTS:
            for frac in KV_FRACTIONS:
                batch = max(1.0, frac * MAX_KV_TOKENS / ctx)
                if batch > MAX_BATCH:
                    continue
                itl = decode_itl_ms(batch, batch * ctx)
                w.writerow([f"{frac:g}", ctx, f"{itl:.4f}", f"{batch * 1000.0 / itl:.2f}"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
