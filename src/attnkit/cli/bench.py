"""`attnkit bench`: the standard speed workloads for attnkit and its installed peers, as markdown tables.

    attnkit bench                                   # every workload, attnkit + every installed peer
    attnkit bench --workloads mt --peers xtransformers --json runs/bench.jsonl
    attnkit bench --workloads lm-train-xl lm-train-vanilla --dtype bfloat16
    attnkit bench --workloads mt-train --rounds 3    # each measurement 3 times, toolkits taking turns
    attnkit bench --quick                           # tiny smoke shapes (tests, CI): NOT the standard workloads

Workloads (../shared/bench/WORKLOADS.md): mt-train, mt-greedy, mt-beam5, lm-train-xl, lm-train-vanilla,
lm-eval-xl, lm-eval-vanilla, and mt-base-greedy, mt-base-beam5 (MT decoding at the Transformer-base shape:
d 512, 8 heads, FFN 2048, 6+6 layers, vocab 32k), mt-opus-greedy, mt-opus-beam5 (decoding one random opus-mt-shape
MarianMTModel, read by each toolkit: bench.opus), lm-train-lstm (attnkit's LSTM LM beside a plain PyTorch loop,
PyTorch's word_language_model example: bench.plain); groups: mt, lm, opus, all. Each measurement runs in a fresh
process; the logic lives in attnkit.bench: runner (plan, tables), measure (timing), one module per toolkit.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from attnkit.bench.catalog import GROUPS, PEERS, WORKLOADS

WORKLOAD_CHOICES = (*GROUPS, *WORKLOADS)
PEER_CHOICES = tuple(PEERS)


def add_parsers(sub) -> dict[str, Callable]:
    b = sub.add_parser("bench", help="standard speed workloads (MT, LM) for attnkit and installed peers: tables",
                       description="The standard workloads of ../shared/bench/WORKLOADS.md (and the MT decoding "
                                   "workloads at the Transformer-base shape and, on one random opus-mt-shape Marian "
                                   "model, mt-opus-*) for attnkit (float32, and int8 where it "
                                   "decodes), Hugging Face transformers, x-transformers and CTranslate2 (float32 and "
                                   "int8; when installed), each measurement in a fresh process; markdown tables on "
                                   "stdout, progress on stderr.")
    b.add_argument("--workloads", nargs="+", default=["all"], choices=WORKLOAD_CHOICES, metavar="WORKLOAD",
                   help=f"workloads or groups (default: all): {', '.join(WORKLOAD_CHOICES)}")
    b.add_argument("--peers", nargs="*", default=list(PEER_CHOICES), choices=PEER_CHOICES, metavar="PEER",
                   help="toolkits measured beside attnkit (default: all; none = attnkit only); missing ones are "
                        "skipped with a note")
    b.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="precision of the training workloads (bfloat16 = autocast) and of the matmul peak")
    b.add_argument("--threads", type=int, default=2, help="torch threads per measurement (the standard: 2)")
    b.add_argument("--rounds", type=int, default=1,
                   help="run every measurement this many times, the toolkits taking turns, and report each "
                        "one's median round (noisy machines)")
    b.add_argument("--quick", action="store_true",
                   help="tiny smoke shapes, one process per toolkit: NOT the standard workloads (tests, CI)")
    b.add_argument("--json", metavar="FILE", help="also write every result as JSON lines here")
    b.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    return {"bench": cmd_bench}


def cmd_bench(args: argparse.Namespace, overrides: list[str]) -> None:
    import json

    from attnkit.bench.runner import annotate, check_outputs, expand_workloads, render, run_bench
    from attnkit.errors import AttnkitError
    from attnkit.io import atomic_write_text, ensure_new_output

    if args.threads < 1:
        raise AttnkitError("--threads must be at least 1")
    if args.rounds < 1:
        raise AttnkitError("--rounds must be at least 1")
    if args.json:
        ensure_new_output(args.json, args.force, "--json file")
    workloads = expand_workloads(args.workloads)
    peers = list(dict.fromkeys(args.peers))
    rows = annotate(run_bench(workloads, peers, dtype=args.dtype, threads=args.threads, quick=args.quick,
                              rounds=args.rounds))
    if args.json:
        atomic_write_text(args.json, "".join(json.dumps(r) + "\n" for r in rows))
    print(render(rows, dtype=args.dtype, threads=args.threads, quick=args.quick))
    check_outputs(rows)  # after the whole table: exit code 1 when the outputs' check failed
