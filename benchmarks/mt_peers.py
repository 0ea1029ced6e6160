"""Workload MT of ../shared/bench/WORKLOADS.md through attnkit and its peers: a shortcut for `attnkit bench`.

    python benchmarks/mt_peers.py                                   # every peer that imports, every MT workload
    python benchmarks/mt_peers.py --peers attnkit xtransformers --workloads greedy beam5 --json mt.jsonl

The peer code (Hugging Face BART, x-transformers XTransformer) lives in attnkit.eval.peers and the timing in
attnkit.eval.speed; this script only translates its options to
`attnkit bench --workloads mt-... --peers ...` (attnkit is always measured).
"""

from __future__ import annotations

import argparse

from attnkit.cli import main as attnkit_main

WORKLOADS = ("train", "greedy", "beam5")
PEERS = ("attnkit", "huggingface", "xtransformers")


def bench_argv(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--json", help="also write the results as JSON lines here (overwritten)")
    args = ap.parse_args(argv)
    out = ["bench", "--workloads", *(f"mt-{w}" for w in args.workloads),
           "--peers", *(p for p in args.peers if p != "attnkit")]
    return out + (["--json", args.json, "--force"] if args.json else [])


if __name__ == "__main__":
    raise SystemExit(attnkit_main(bench_argv()))
