"""`attnkit experiment ...`: one command per comparison claim, each writing a table and a plot to a folder.

    attnkit experiment compare --data DIR --out DIR --models rnn-seq2seq rnn-bahdanau transformer-small --minutes 45
    attnkit experiment by-length --data DIR --out DIR --checkpoints RUN1/checkpoints/best.safetensors ...
    attnkit experiment heads --data DIR --out DIR --preset transformer-small --heads 1 2 4 8 --minutes 15
    attnkit experiment parts --data DIR --out DIR --preset multi30k --updates 3000
    attnkit experiment ancestors --data DIR --out DIR --updates 1000
    attnkit experiment lm-ablation --data wikitext-2 --out DIR --minutes-per-model 30
    attnkit experiment xl-table6 --data wikitext-2 --out DIR --updates 4000
    attnkit experiment recl --data wikitext-2 --out DIR --updates 4000
    attnkit experiment planted-recall --data tiny-shakespeare --out DIR --updates 2000

The logic lives in attnkit.experiments (compare, rows, by_length, lm_ablation, xl_table6, recl_groups, planted_recall);
this module only parses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from attnkit.cli.options import add_decode_options, add_device_option, add_overrides, add_trust_option, decode_options
from attnkit.errors import AttnkitError


def add_parsers(sub) -> dict[str, Callable]:
    p = sub.add_parser("experiment", help="compare model families: compare (same budget), by-length (BLEU per "
                                          "length), heads (1..8 heads), parts (one part taken away per row), "
                                          "ancestors (fixed vector, RNN attentions, Transformer), "
                                          "lm-ablation (recurrence x positions), "
                                          "xl-table6, recl, planted-recall (Transformer-XL's claims)")
    ex = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")

    c = ex.add_parser("compare", help="train several models on the same data and budget; table + bar plot")
    c.set_defaults(trains="translation", run=cmd_compare)
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
    b.add_argument("--tokenize", metavar="TOK", help="sacreBLEU's tokenizer (13a, zh, char, ...); default: the "
                                                     "target language's, which the checkpoint records")
    add_device_option(b)
    add_decode_options(b)
    _add_heads(ex)
    _add_parts(ex)
    _add_ancestors(ex)
    _add_lm_ablation(ex)
    _add_xl_table6(ex)
    _add_recl(ex)
    _add_planted_recall(ex)
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
    h.set_defaults(trains="translation", run=cmd_heads)
    add_overrides(h)
    h.add_argument("--data", required=True, help="folder written by `attnkit prepare` (e.g. Multi30k)")
    h.add_argument("--out", required=True, help="folder for the runs (OUT/heads-<h>), heads.{csv,md,png}")
    h.add_argument("--preset", default="transformer-small", metavar="PRESET|FILE", help="the model every row trains")
    h.add_argument("--heads", type=int, nargs="+", default=[1, 2, 4, 8], help="numbers of heads; each divides d_model")
    _add_budget_options(h, "the preset's")


def _add_parts(ex) -> None:
    from attnkit.experiments.rows import PARTS

    p = ex.add_parser("parts", help="one preset with one part of the paper's model taken away per row (residual, FFN, "
                                    "W^O, separate keys, sqrt(d_k), positions); equal updates; dev/test BLEU")
    p.set_defaults(trains="translation", run=cmd_parts)
    add_overrides(p)
    p.add_argument("--data", required=True, help="folder written by `attnkit prepare` (e.g. Multi30k)")
    p.add_argument("--out", required=True, help="folder for the runs (OUT/<part>), parts.{csv,md,png}")
    p.add_argument("--preset", default="transformer-small", metavar="PRESET|FILE", help="the model every row trains")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS), metavar="PART",
                   help=f"rows: {', '.join(PARTS)} (default: all)")
    _add_row_updates(p, "the preset's budget")
    _add_budget_options(p, "the preset's")


def _add_ancestors(ex) -> None:
    from attnkit.experiments.rows import ANCESTORS

    a = ex.add_parser("ancestors", help="the fixed-vector RNN, Bahdanau, Luong (dot, general, concat, cosine), hard "
                                        "attention (REINFORCE, Gumbel) and the Transformer; equal updates; dev/test "
                                        "BLEU")
    a.set_defaults(trains="translation", run=cmd_ancestors)
    add_overrides(a)
    a.add_argument("--data", required=True, help="folder written by `attnkit prepare` (e.g. Multi30k)")
    a.add_argument("--out", required=True, help="folder for the runs (OUT/<row>), ancestors.{csv,md,png}")
    a.add_argument("--rows", nargs="+", default=list(ANCESTORS), choices=list(ANCESTORS), metavar="ROW",
                   help=f"rows: {', '.join(ANCESTORS)} (default: all)")
    _add_row_updates(a, "each preset's budget")
    _add_budget_options(a, "each preset's")


def _add_row_updates(p, default: str) -> None:
    p.add_argument("--updates", type=int, help=f"the same number of updates for every row, without a time limit "
                                               f"(default: {default})")


def _add_lm_ablation(ex) -> None:
    a = ex.add_parser("lm-ablation", help="Transformer-XL, no recurrence, absolute positions with recurrence, vanilla "
                                          "and LSTM LMs on one time budget; perplexity by attention length")
    a.set_defaults(trains="lm", run=cmd_lm_ablation)
    add_overrides(a)
    _add_corpus_options(a, "lm_ablation.{md,csv,json,png}")
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
    _add_rerun_options(a)


def _add_corpus_options(p, outputs: str) -> None:
    """--data, --corpora, --out: what every LM experiment reads and writes."""
    p.add_argument("--data", required=True, metavar="wikitext-2|tiny-shakespeare|DIR",
                   help="a corpus of --corpora (prepared once into OUT/data), or a folder written by "
                        "`attnkit lm prepare`")
    p.add_argument("--corpora", default="../shared/data", help="the folder holding wikitext-2/ and tiny_shakespeare/")
    p.add_argument("--out", required=True, help=f"folder for the runs (OUT/<model>), {outputs}")


def _add_rerun_options(p) -> None:
    p.add_argument("--force", action="store_true", help="train every model anew (a rerun reuses the models of the "
                                                        "same settings and refuses others)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_device_option(p)


def _add_updates(p, required: bool = True) -> None:
    p.add_argument("--updates", type=int, required=required,
                   help="the same number of updates for every model (each preset's segment and batch; the cosine "
                        "decays over them); a model trained so in OUT by another of these experiments is reused")


def _add_xl_table6(ex) -> None:
    a = ex.add_parser("xl-table6", help="Transformer-XL's table 6: equal segment and updates, same_length / clamp_len "
                                        "evaluation, perplexity at the training and the best attention length")
    a.set_defaults(trains="lm", run=cmd_xl_table6)
    add_overrides(a)
    _add_corpus_options(a, "xl_table6.{md,csv,json,png}")
    _add_updates(a)
    a.add_argument("--models", nargs="+", metavar="PRESET|FILE",
                   help="presets to train (default: the corpus's six, e.g. lm-word-wt2, lm-word-wt2-no-recurrence-64, "
                        "lm-word-wt2-no-recurrence, lm-word-wt2-absolute, lm-word-wt2-vanilla-64, "
                        "lm-word-wt2-lstm-matched)")
    a.add_argument("--lengths", type=int, nargs="+",
                   help="attention lengths to evaluate at, besides each model's training length (default: 64 .. 512 "
                        "for words, 64 .. 1024 for characters)")
    a.add_argument("--clamp-len", nargs="+", default=["0", "train"], metavar="N|train",
                   help="clamp_len values to choose from on validation for relative positions (0: none; train: the "
                        "model's training attention length)")
    a.add_argument("--segment", type=int, default=64, help="evaluation segment T")
    a.add_argument("--eval-batch-size", type=int, default=8, help="parallel streams at evaluation")
    a.add_argument("--eval-tokens", type=int, default=0, help="score only the first N tokens (0 = the whole split)")
    _add_rerun_options(a)


def _add_recl(ex) -> None:
    a = ex.add_parser("recl", help="relative effective context length as the paper's appendix C: equal-parameter "
                                   "groups, uniform steps, every token with exactly c tokens of context")
    a.set_defaults(trains="lm", run=cmd_recl)
    add_overrides(a)
    _add_corpus_options(a, "recl.{md,csv,json,png}")
    _add_updates(a, required=False)
    a.add_argument("--group", nargs="+", action="append", metavar=("NAME", "MEMBER"),
                   help="a group: its name, then its members, the Transformer-XL first: presets to train, or "
                        "LABEL=CHECKPOINT (e.g. an imported model) to score as it is (repeat for several; default: "
                        "rnn = XL + the LSTM of its size, transformer = XL + no recurrence + vanilla)")
    a.add_argument("--delta", type=int, default=0, help="the step between contexts (default: 32 words, 64 characters)")
    a.add_argument("--longest", type=int, default=0, help="the longest context (default: 512 words, 1024 characters)")
    a.add_argument("--tokens", type=int, default=2048, help="target tokens scored, evenly spaced over the split")
    a.add_argument("--recl-r", type=float, nargs="+", default=[0.1, 0.5, 1.0], help="fractions of hardest tokens")
    a.add_argument("--recl-threshold", type=float, default=0.01, help="the relative-gain threshold")
    a.add_argument("--clamp-len", type=int, default=0, help="clamp_len for relative positions (0: none)")
    a.add_argument("--eval-batch-size", type=int, default=64,
                   help="windows per forward pass at most (fewer for long contexts: 4,096 tokens a pass)")
    _add_rerun_options(a)


def _add_planted_recall(ex) -> None:
    a = ex.add_parser("planted-recall", help="keys planted in real text and recalled D tokens later: Transformer-XL, "
                                             "no recurrence, vanilla and LSTM trained for equal updates, recall by D")
    a.set_defaults(trains="lm", run=cmd_planted_recall)
    add_overrides(a)
    _add_corpus_options(a, "planted/ (the planted corpus and its models), planted_recall.{md,csv,json,png}")
    _add_updates(a)
    a.add_argument("--models", nargs="+", metavar="PRESET|FILE",
                   help="presets to train (default: e.g. lm-char-small-xl, lm-char-small-no-recurrence-64, "
                        "lm-char-small-vanilla-64, lm-char-small-lstm-matched)")
    a.add_argument("--distances", type=int, nargs="+", default=[24, 48, 96, 192, 384, 768],
                   help="distances D of the evaluation text's pairs (the training text's are drawn from their range)")
    a.add_argument("--train-distances", type=int, nargs=2, default=[24, 768], metavar=("LO", "HI"),
                   help="the range the training text's D is drawn from")
    a.add_argument("--train-spacing", choices=["uniform", "log"], default="uniform",
                   help="training D uniform over the range, or log-uniform (more short pairs)")
    a.add_argument("--gap", type=int, nargs=2, default=[16, 64], metavar=("LO", "HI"),
                   help="tokens of text before each pair, drawn from this range")
    a.add_argument("--key-len", type=int, default=0, help="key tokens (default: 6 characters or 3 words)")
    a.add_argument("--eval-batch-size", type=int, default=8, help="rows (streams) of the evaluation text")
    a.add_argument("--seed", type=int, default=1, help="the planting's seed")
    a.add_argument("--split", choices=["valid", "test"],
                   help="the split scored (default: test, valid where there is none; valid to choose the planting)")
    _add_rerun_options(a)


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
                   edges=args.edges, unit=args.unit, metric=args.metric, device=args.device, tokenize=args.tokenize)
    print((Path(args.out) / "by_length.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/by_length.csv, by_length.md, by_length.png")


def cmd_heads(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments.compare import compare_heads

    compare_heads(args.preset, args.heads, args.data, args.out, overrides=overrides, minutes=args.minutes,
                  options=decode_options(args), force=args.force, reuse=args.reuse, progress=not args.quiet)
    print((Path(args.out) / "heads.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/heads.csv, heads.md, heads.png ({len(args.heads)} models)")


def cmd_parts(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments.compare import compare_parts

    compare_parts(args.preset, args.parts, args.data, args.out, updates=args.updates, overrides=overrides,
                  minutes=args.minutes, options=decode_options(args), force=args.force, reuse=args.reuse,
                  progress=not args.quiet)
    print((Path(args.out) / "parts.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/parts.csv, parts.md, parts.png ({len(args.parts)} models)")


def cmd_ancestors(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments.compare import compare_ancestors

    compare_ancestors(args.rows, args.data, args.out, updates=args.updates, overrides=overrides, minutes=args.minutes,
                      options=decode_options(args), force=args.force, reuse=args.reuse, progress=not args.quiet)
    print((Path(args.out) / "ancestors.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/ancestors.csv, ancestors.md, ancestors.png ({len(args.rows)} models)")


def cmd_lm_ablation(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.data.lm import load_lm_corpus
    from attnkit.experiments import lm_ablation as ab

    if args.segment < 1 or args.eval_batch_size < 1 or args.eval_tokens < 0:
        raise AttnkitError("lm-ablation: --segment and --eval-batch-size must be positive, --eval-tokens not negative")
    out = Path(args.out)
    data = ab.prepare_data(args.data, out, Path(args.corpora))
    level = load_lm_corpus(data).vocab.level
    ev = ab.Evaluation(args.split or ab.default_split(data), args.segment, args.eval_batch_size, args.eval_tokens,
                       args.device)
    ab.lm_ablation(args.models or ab.default_presets(level), data, out, args.lengths or ab.default_lengths(level), ev,
                   overrides=overrides, minutes=args.minutes_per_model, force=args.force, progress=not args.quiet)
    print((out / "lm_ablation.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {out}/lm_ablation.md, lm_ablation.csv, lm_ablation.json, lm_ablation.png")


def _lm_data(args: argparse.Namespace):
    from attnkit.data.lm import load_lm_corpus
    from attnkit.experiments import lm_ablation as ab

    data = ab.prepare_data(args.data, Path(args.out), Path(args.corpora))
    return data, load_lm_corpus(data).vocab.level


def cmd_xl_table6(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments import xl_table6

    clamps = []
    for value in args.clamp_len:
        if value != xl_table6.TRAIN_LENGTH and not (value.isdigit()):
            raise AttnkitError(f"xl-table6: --clamp-len takes numbers >= 0 or `train`, not {value!r}")
        clamps.append(value if value == xl_table6.TRAIN_LENGTH else int(value))
    data, level = _lm_data(args)
    xl_table6.xl_table6(args.models or xl_table6.table6_presets(level), data, Path(args.out), args.updates,
                        lengths=args.lengths or (), clamps=clamps, segment=args.segment, streams=args.eval_batch_size,
                        max_tokens=args.eval_tokens, device=args.device, overrides=overrides, force=args.force,
                        progress=not args.quiet)
    print((Path(args.out) / "xl_table6.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/xl_table6.md, xl_table6.csv, xl_table6.json, xl_table6.png")


def cmd_recl(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments import recl_groups

    groups = {}
    for group in args.group or ():
        if len(group) < 2 or group[0] in groups:
            raise AttnkitError(f"recl: --group takes a new name and its members, not {' '.join(group)}")
        groups[group[0]] = group[1:]
    data, level = _lm_data(args)
    recl_groups.recl_groups(groups or recl_groups.default_groups(level), data, Path(args.out), args.updates,
                            delta=args.delta, longest=args.longest, tokens=args.tokens, rs=args.recl_r,
                            threshold=args.recl_threshold, clamp_len=args.clamp_len, batch_size=args.eval_batch_size,
                            device=args.device, overrides=overrides, force=args.force, progress=not args.quiet)
    print((Path(args.out) / "recl.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/recl.md, recl.csv, recl.json, recl.png")


def cmd_planted_recall(args: argparse.Namespace, overrides: list[str]) -> None:
    from attnkit.experiments import planted_recall as pr

    data, level = _lm_data(args)
    changes = dict(distances=tuple(args.distances), train_distances=tuple(args.train_distances),
                   train_spacing=args.train_spacing, gap=tuple(args.gap), streams=args.eval_batch_size, seed=args.seed)
    planting = pr.default_planting(level, **changes)
    if args.key_len:
        planting = pr.Planting(key_len=args.key_len, **changes)
    pr.planted_recall(args.models or pr.default_models(level), data, Path(args.out), args.updates, planting=planting,
                      overrides=overrides, device=args.device, split=args.split, force=args.force,
                      progress=not args.quiet)
    print((Path(args.out) / "planted_recall.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.out}/planted_recall.md, planted_recall.csv, planted_recall.json, planted_recall.png")
