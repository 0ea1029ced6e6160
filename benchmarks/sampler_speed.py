"""How long the token-budget sampler takes to plan one Multi30k-sized epoch (29,000 pairs, 4,096 tokens a batch).

    python benchmarks/sampler_speed.py [--runs 5]

Prints the median of the runs; planning is linear in the corpus (one sort, one pass), about 10-20 ms here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from attnkit.data import TokenBatchSampler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(5, 40, size=29_000), rng.integers(5, 40, size=29_000)
    sampler = TokenBatchSampler(src, tgt, max_tokens=4096)
    times = []
    for epoch in range(args.runs):
        start = time.perf_counter()
        sampler.batches(epoch)
        times.append(time.perf_counter() - start)
    print(f"one epoch planned in {statistics.median(times) * 1e3:.1f} ms (median of {args.runs})")


if __name__ == "__main__":
    main()
