"""`attnkit experiment ...`: one command per comparison claim, each writing a table and a plot to a folder.

    attnkit experiment compare --data DIR --out DIR --models rnn-seq2seq rnn-bahdanau transformer-small --minutes 45
    attnkit experiment by-length --data DIR --out DIR --checkpoints RUN1/checkpoints/best.safetensors ...

The logic lives in attnkit.experiments (compare, by_length); this module only parses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from attnkit.cli.options import add_decode_options, add_device_option, add_overrides, add_trust_option, decode_options
from attnkit.errors import AttnkitError


def add_parsers(sub) -> dict[str, Callable]:
    p = sub.add_parser("experiment", help="compare model families: compare (same budget), by-length (BLEU per length)")
    ex = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")

    c = ex.add_parser("compare", help="train several models on the same data and budget; table + bar plot")
    c.set_defaults(bounds_kernel_caches=True, run=cmd_compare)
    add_overrides(c)
    c.add_argument("--data", required=True, help="folder written by `attnkit prepare`")
    c.add_argument("--out", required=True, help="folder for the runs (OUT/<model>), compare.{csv,md,png}")
    c.add_argument("--models", nargs="+", default=["rnn-seq2seq", "rnn-bahdanau"], metavar="PRESET|FILE",
                   help="presets or YAML files to train (default: rnn-seq2seq rnn-bahdanau)")
    c.add_argument("--minutes", type=float, help="the same wall-clock training budget for every model "
                                                 "(default: each preset's train.max_minutes)")
    c.add_argument("--force", action="store_true", help="retrain models whose folder already holds a run")
    c.add_argument("--reuse", action="store_true", help="evaluate models already trained in OUT instead of training")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    add_decode_options(c)

    b = ex.add_parser("by-length", help="BLEU per source-length bucket for each checkpoint; table + line chart")
    b.set_defaults(run=cmd_by_length)
    b.add_argument("--checkpoints", nargs="+", required=True, metavar="[LABEL=]PATH",
                   help="checkpoints to compare; the label defaults to the run folder's name")
    add_trust_option(b)
    b.add_argument("--data", help="prepared data folder: translate its --split")
    b.add_argument("--split", choices=["valid", "test"], default="test", help="with --data: which split")
    b.add_argument("--src", help="source file (instead of --data)")
    b.add_argument("--ref", help="reference file, line-aligned with --src")
    b.add_argument("--out", required=True, help="folder for by_length.{csv,md,png}")
    b.add_argument("--buckets", type=int, default=5, help="number of equal-count length buckets (default 5)")
    b.add_argument("--edges", type=int, nargs="+", help="explicit bucket ends in source words, e.g. 10 20 30")
    b.add_argument("--unit", choices=["words", "pieces"], default="words",
                   help="count source length in words (default) or subword pieces")
    b.add_argument("--metric", choices=["bleu", "bleu_lc"], default="bleu", help="what the chart plots")
    add_device_option(b)
    add_decode_options(b)
    return {"experiment": cmd_experiment}


def cmd_experiment(args: argparse.Namespace, overrides: list[str]) -> None:
    args.run(args, overrides)


def cmd_compare(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments.compare import compare_models

    results = compare_models(args.models, args.data, args.out, overrides=overrides, minutes=args.minutes,
                             options=decode_options(args), force=args.force, reuse=args.reuse,
                             progress=not args.quiet)
    print((Path(args.out) / "compare.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/compare.csv, compare.md, compare.png ({len(results)} models)")


def cmd_by_length(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.data import read_lines, read_parallel
    from attnkit.experiments.by_length import bleu_by_length, checkpoint_label

    if args.data and (args.src or args.ref):
        raise AttnkitError("by-length: give --data, or --src and --ref, not both")
    if args.data:
        data = Path(args.data)
        sources, refs = read_lines(data / f"{args.split}.src.txt"), read_lines(data / f"{args.split}.tgt.txt")
    elif args.src and args.ref:
        sources, refs = read_parallel(args.src, args.ref)
    else:
        raise AttnkitError("by-length: give --data (a prepared folder), or --src and --ref")
    checkpoints = {}
    for item in args.checkpoints:
        label, sep, path = item.partition("=")
        label, path = (label, path) if sep else (checkpoint_label(item), item)
        if label in checkpoints:
            raise AttnkitError(f"by-length: two checkpoints are labelled '{label}'; name them LABEL=PATH")
        checkpoints[label] = path
    bleu_by_length(checkpoints, sources, refs, args.out, options=decode_options(args), n_buckets=args.buckets,
                   edges=args.edges, unit=args.unit, metric=args.metric, device=args.device)
    print((Path(args.out) / "by_length.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/by_length.csv, by_length.md, by_length.png")

