"""attnkit beside its peers on the workloads of ../shared/bench/WORKLOADS.md: a shortcut for `attnkit bench`.

    python benchmarks/peers.py                                      # every peer that imports, every workload
    python benchmarks/peers.py --family mt --peers attnkit xtransformers --workloads greedy beam5
    python benchmarks/peers.py --family lm --peers attnkit xtransformers --json lm.jsonl

The peer code (Hugging Face BART / GPT-2, x-transformers XTransformer / TransformerWrapper with memory) lives
in attnkit.eval.peers and the timing in attnkit.eval.speed, so `attnkit bench` runs the same measurements;
this script only translates its options to `attnkit bench --workloads ... --peers ...` (attnkit is always
measured).
"""

from __future__ import annotations

import argparse

from attnkit.cli import main as attnkit_main

WORKLOADS = {"mt": ("train", "greedy", "beam5"), "lm": ("train-xl", "train-vanilla", "eval-xl", "eval-vanilla")}
PEERS = ("attnkit", "huggingface", "xtransformers")


def bench_argv(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    ap.add_argument("--workloads", nargs="+", help="of the chosen families (default: all of them): "
                    + "; ".join(f"{f}: {' '.join(w)}" for f, w in WORKLOADS.items()))
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--json", help="also write the results as JSON lines here (overwritten)")
    args = ap.parse_args(argv)
    chosen = [f"{f}-{w}" for f in args.family for w in WORKLOADS[f] if args.workloads is None or w in args.workloads]
    if not chosen:
        ap.error(f"none of --workloads {' '.join(args.workloads)} belongs to --family {' '.join(args.family)}")
    out = ["bench", "--workloads", *chosen, "--peers", *(p for p in args.peers if p != "attnkit"),
           "--dtype", args.dtype]
    return out + (["--json", args.json, "--force"] if args.json else [])


if __name__ == "__main__":
    raise SystemExit(attnkit_main(bench_argv()))
