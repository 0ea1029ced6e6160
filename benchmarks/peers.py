"""attnkit beside its peers on the workloads of ../shared/bench/WORKLOADS.md: a shortcut for `attnkit bench`.

    python benchmarks/peers.py                                      # every peer that imports, every workload
    python benchmarks/peers.py --family mt --peers attnkit xtransformers --workloads greedy beam5
    python benchmarks/peers.py --family lm --peers attnkit xtransformers --json lm.jsonl

The peer code (Hugging Face BART / GPT-2, x-transformers XTransformer / TransformerWrapper with memory) lives
in attnkit.bench (one module per toolkit, the timing in measure), so `attnkit bench` runs the same measurements;
this script only translates its options to `attnkit bench --workloads ... --peers ...` (attnkit is always
measured).
"""

from __future__ import annotations

import argparse

from attnkit.bench.catalog import GROUPS
from attnkit.bench.catalog import PEERS as PEER_TOOLKITS
from attnkit.cli.main import main as attnkit_main

# family -> its workloads without the family prefix (mt-greedy -> greedy)
WORKLOADS = {f: tuple(w.split("-", 1)[1] for w in GROUPS[f]) for f in ("mt", "lm")}
PEERS = ("attnkit", *PEER_TOOLKITS)


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
