"""`attnkit experiment ...`: one command per comparison claim, each writing a table and a plot to a folder.

    attnkit experiment compare --data DIR --out DIR --models rnn-seq2seq rnn-bahdanau transformer-small --minutes 45
    attnkit experiment by-length --data DIR --out DIR --checkpoints RUN1/checkpoints/best.safetensors ...
    attnkit experiment heads --data DIR --out DIR --preset transformer-small --heads 1 2 4 8 --minutes 15
    attnkit experiment lm-ablation --data wikitext-2 --out DIR --minutes-per-model 30

The logic lives in attnkit.experiments (compare, by_length, lm_ablation); this module only parses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from attnkit.cli.options import add_decode_options, add_device_option, add_overrides, add_trust_option, decode_options
from attnkit.errors import AttnkitError


def add_parsers(sub) -> dict[str, Callable]:
    p = sub.add_parser("experiment", help="compare model families: compare (same budget), by-length (BLEU per "
                                          "length), heads (1..8 heads), lm-ablation (recurrence x positions, RECL)")
    ex = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")

    c = ex.add_parser("compare", help="train several models on the same data and budget; table + bar plot")
    c.set_defaults(trains=True, run=cmd_compare)
    add_overrides(c)
    c.add_argument("--data", required=True, help="folder written by `attnkit prepare`")
    c.add_argument("--out", required=True, help="folder for the runs (OUT/<model>), compare.{csv,md,png}")
    c.add_argument("--models", nargs="+", default=["rnn-seq2seq", "rnn-bahdanau"], metavar="PRESET|FILE",
                   help="presets or YAML files to train (default: rnn-seq2seq rnn-bahdanau)")
    _add_budget_options(c, "each preset's")

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
    _add_heads(ex)
    _add_lm_ablation(ex)
    return {"experiment": cmd_experiment}


def _add_budget_options(p, whose: str) -> None:
    """What every experiment that trains several models takes: one budget, retraining, reuse, decoding."""
    p.add_argument("--minutes", type=float, help="the same wall-clock training budget for every model "
                                                 f"(default: {whose} train.max_minutes)")
    p.add_argument("--force", action="store_true", help="retrain models whose folder already holds a run")
    p.add_argument("--reuse", action="store_true", help="evaluate models already trained in OUT with the same "
                                                        "settings and data instead of training")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_decode_options(p)


def _add_heads(ex) -> None:
    h = ex.add_parser("heads", help="one preset with 1, 2, 4, 8 heads at equal d_model and budget; dev/test BLEU")
    h.set_defaults(trains=True, run=cmd_heads)
    add_overrides(h)
    h.add_argument("--data", required=True, help="folder written by `attnkit prepare` (e.g. Multi30k)")
    h.add_argument("--out", required=True, help="folder for the runs (OUT/heads-<h>), heads.{csv,md,png}")
    h.add_argument("--preset", default="transformer-small", metavar="PRESET|FILE", help="the model every row trains")
    h.add_argument("--heads", type=int, nargs="+", default=[1, 2, 4, 8], help="numbers of heads; each divides d_model")
    _add_budget_options(h, "the preset's")


def _add_lm_ablation(ex) -> None:
    a = ex.add_parser("lm-ablation", help="Transformer-XL, no recurrence, absolute positions with recurrence, vanilla "
                                          "and LSTM LMs on one budget; perplexity by attention length and RECL")
    a.set_defaults(trains=True, run=cmd_lm_ablation)
    add_overrides(a)
    a.add_argument("--data", required=True, metavar="wikitext-2|tiny-shakespeare|DIR",
                   help="a corpus of --corpora (prepared once into OUT/data), or a folder written by "
                        "`attnkit lm prepare`")
    a.add_argument("--corpora", default="../shared/data", help="the folder holding wikitext-2/ and tiny_shakespeare/")
    a.add_argument("--out", required=True, help="folder for the runs (OUT/<model>), lm_ablation.{md,csv,json,png}")
    a.add_argument("--models", nargs="+", metavar="PRESET|FILE",
                   help="presets to train (default: the corpus's five, e.g. lm-word-wt2, lm-word-wt2-no-recurrence, "
                        "lm-word-wt2-absolute, lm-word-wt2-vanilla, lm-word-wt2-lstm)")
    a.add_argument("--minutes-per-model", type=float, help="the same wall-clock training budget for every model "
                                                           "(default: each preset's train.max_minutes)")
    a.add_argument("--lengths", type=int, nargs="+",
                   help="attention lengths to evaluate at (default: 64 128 256 512 for words, 128 .. 1024 for chars)")
    a.add_argument("--segment", type=int, default=64, help="evaluation segment T (memory or context: length - T)")
    a.add_argument("--split", choices=["valid", "test"], help="split to score (default: test when there is one)")
    a.add_argument("--eval-batch-size", type=int, default=8, help="parallel streams at evaluation")
    a.add_argument("--eval-tokens", type=int, default=0, help="score only the first N tokens (0 = the whole split)")
    a.add_argument("--recl-r", type=float, nargs="+", default=[0.1, 0.5], help="RECL's fractions of hardest tokens")
    a.add_argument("--recl-threshold", type=float, default=0.01, help="RECL's relative-gain threshold")
    a.add_argument("--force", action="store_true", help="train every model anew (a rerun reuses the models of the "
                                                        "same settings and refuses others)")
    a.add_argument("--quiet", action="store_true", help="no progress bars")
    add_device_option(a)


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


def cmd_heads(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments.compare import compare_heads

    compare_heads(args.preset, args.heads, args.data, args.out, overrides=overrides, minutes=args.minutes,
                  options=decode_options(args), force=args.force, reuse=args.reuse, progress=not args.quiet)
    print((Path(args.out) / "heads.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/heads.csv, heads.md, heads.png ({len(args.heads)} models)")


def cmd_lm_ablation(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.data.lm import load_lm_corpus
    from attnkit.experiments import lm_ablation as ab

    if args.segment < 1 or args.eval_batch_size < 1 or args.eval_tokens < 0:
        raise AttnkitError("lm-ablation: --segment and --eval-batch-size must be positive, --eval-tokens not negative")
    if not all(0 < r <= 1 for r in args.recl_r):
        raise AttnkitError(f"lm-ablation: --recl-r takes fractions in (0, 1], not {args.recl_r}")
    out = Path(args.out)
    data = ab.prepare_data(args.data, out, Path(args.corpora))
    level = load_lm_corpus(data).vocab.level
    ev = ab.Evaluation(args.split or ab.default_split(data), args.segment, args.eval_batch_size, args.eval_tokens,
                       args.device)
    ab.lm_ablation(args.models or ab.default_presets(level), data, out, args.lengths or ab.default_lengths(level), ev,
                   overrides=overrides, minutes=args.minutes_per_model, recl_r=args.recl_r,
                   threshold=args.recl_threshold, force=args.force, progress=not args.quiet)
    print((out / "lm_ablation.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {out}/lm_ablation.md, lm_ablation.csv, lm_ablation.json, lm_ablation.png")
