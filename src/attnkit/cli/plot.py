"""`attnkit plot WHAT`: the pictures of attnkit.viz, one sub-verb each.

attention (PNG grids, --html page, --stats), decoding, positions, order, schedule, curves, softmax, report.
Every output goes to --out and is never overwritten without --force.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from attnkit.cli.options import add_checkpoint_option, add_config_option, add_device_option, add_overrides, text
from attnkit.errors import AttnkitError

HTML_SENTENCES = 20  # sentences of --src-file the --html page holds


def add_parsers(sub) -> dict[str, Callable]:
    p = sub.add_parser("plot", help="pictures: attention, decoding, positions, order, schedule, curves, crossing, "
                                    "softmax, report")
    what = p.add_subparsers(dest="what", required=True, metavar="WHAT")

    _add_attention_parser(what)

    d = what.add_parser("decoding", help="one sentence decoded step by step (greedy) next to the single "
                                         "teacher-forced pass with its causal mask, and where they differ")
    add_checkpoint_option(d)
    d.add_argument("--src", required=True, type=text, help="the source sentence")
    d.add_argument("--tgt", type=text, help="the target teacher forcing reads (default: the greedy output, which it "
                                            "must reproduce to float rounding)")
    add_device_option(d, "cpu")
    _out(d, "decoding.png")

    pos = what.add_parser("positions", help="the sinusoidal positional encoding and its offset dot products")
    pos.add_argument("--d-model", type=int, default=128, help="encoding dimensions")
    pos.add_argument("--positions", type=int, default=100, help="positions to draw")
    pos.add_argument("--linear", action="store_true",
                     help="add the check that PE(p + k) is a linear map (a block rotation) of PE(p): the "
                          "least-squares map for --offset and its residual for every offset, against a random table")
    pos.add_argument("--offset", type=int, default=10, help="with --linear: the offset k whose fitted map is drawn")
    pos.add_argument("--fit-positions", type=int, default=1000,
                     help="with --linear: positions p the maps are fitted over (more than --d-model)")
    _out(pos, "positions.png")

    o = what.add_parser("order", help="without positions attention cannot see order: one encoder map of a "
                                      "sentence and of its shuffle, without positions and with sinusoids")
    o.add_argument("--src", type=text, default="the cat sat on the mat because it was warm",
                   help="the sentence (words split at spaces for the random model; a checkpoint's own tokenizer)")
    o.add_argument("--checkpoint", help="a Transformer translation checkpoint whose encoder is drawn (default: a "
                                        "small model with seeded random weights)")
    o.add_argument("--layer", type=int, default=-1, help="encoder layer counted from 1 (-1 = the last)")
    o.add_argument("--head", type=int, default=1, help="head, counted from 1")
    o.add_argument("--seed", type=int, default=0, help="seed of the shuffle (and of the random model)")
    _out(o, "order.png")

    s = what.add_parser("schedule", help="the learning-rate curve of a configured schedule")
    add_overrides(s)
    add_config_option(s, "none: the paper's Noam schedule")
    s.add_argument("--schedule", choices=["noam", "inverse_sqrt", "cosine", "constant"],
                   help="train.schedule (default: the config's)")
    s.add_argument("--lr", type=float, help="peak learning rate, train.lr (default: the config's)")
    s.add_argument("--warmup", type=int, help="warm-up updates, train.warmup (default: the config's)")
    s.add_argument("--d-model", type=int, help="model.d_model, which scales Noam's curve (default: the config's)")
    s.add_argument("--total", type=int, help="train.max_steps: the cosine horizon")
    s.add_argument("--steps", type=int, default=0, help="updates to draw (default: max_steps or 10 x warmup)")
    _out(s, "schedule.png")

    c = what.add_parser("curves", help="loss / ppl / BLEU and lr of run folders against steps and wall-clock")
    c.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (each with its metrics.csv)")
    c.add_argument("--x", choices=["step", "time", "both"], default="both",
                   help="x axis: updates, wall-clock minutes, or one panel of each")
    _out(c, "curves.png")

    x = what.add_parser("crossing", help="validation curves against minutes of lm-ablation folders (one panel each) "
                                         "and the minute each model goes below the LSTM for good")
    x.add_argument("ablations", nargs="+", metavar="ABLATION_DIR", help="folders of `attnkit experiment lm-ablation`")
    _out(x, "crossing.png")

    sm = what.add_parser("softmax", help="why scores are divided by sqrt(d_k): sampled q.k against d_k, and the "
                                         "logits [a, a, 2a] against a")
    sm.add_argument("--max-dk", type=int, default=1024, help="largest key dimension d_k drawn")
    sm.add_argument("--keys", type=int, default=32, help="keys per query")
    sm.add_argument("--samples", type=int, default=1000, help="random queries per d_k")
    sm.add_argument("--seed", type=int, default=0, help="random seed")
    _out(sm, "softmax.png")

    r = what.add_parser("report", help="report.html of a run folder")
    r.add_argument("run", metavar="RUN_DIR", help="a run folder written by a training verb")
    r.add_argument("--data", help="the prepared data folder, for sample translations")
    r.add_argument("--samples", type=int, default=3, help="sample translations to show")
    r.add_argument("--out", help="output file (default: RUN_DIR/report.html)")
    r.add_argument("--force", action="store_true", help="overwrite an existing report")
    return {"plot": cmd_plot}



def _add_attention_parser(what) -> None:
    a = what.add_parser("attention", help="attention maps of a checkpoint as PNG grids, an HTML page or --stats")
    add_checkpoint_option(a, nargs="+", metavar="CKPT",
                          help="a .safetensors checkpoint written by attnkit; several translation checkpoints are one "
                               "ensemble (as in `attnkit translate`), drawn with the mean of the members' maps (the "
                               "first member's where their kinds, layers or heads differ), as each title says")
    a.add_argument("--src", type=text, help="a source sentence (for a language model: the text it reads)")
    a.add_argument("--tgt", type=text,
                   help="its target (default: the model's greedy translation; not for language models)")
    a.add_argument("--layer", default="all", help="layer number counted from 1 (-1 = the last), or all")
    a.add_argument("--kind", default="all", choices=["enc", "dec", "cross", "self", "scores", "all"],
                   help="encoder self, decoder masked self, encoder-decoder (the only kind of RNN models), "
                        "a language model's self-attention, or all the model has")
    a.add_argument("--mem-len", type=int,
                   help="Transformer-XL: how many leading tokens of the text become the memory; the rest is the "
                        "segment drawn over [memory | segment] (default: the first half)")
    a.add_argument("--html", action="store_true",
                   help="the attention explorer instead of PNGs: one self-contained page with bertviz's head and "
                        "model views, heatmaps and per-token summaries")
    a.add_argument("--beam", type=int, default=1,
                   help="with --html and no --tgt: translate with this beam and show each of --nbest hypotheses")
    a.add_argument("--nbest", type=int, default=1, help="with --html: hypotheses per sentence (at most --beam)")
    a.add_argument("--bertviz", metavar="FILE.pt",
                   help="also save the attention as bertviz's input (one file per sentence): "
                        "head_view(**torch.load(FILE)) or model_view(**torch.load(FILE)) draws it there")
    a.add_argument("--stats", action="store_true",
                   help="print per layer the share of target tokens attending near the diagonal (needs --src-file)")
    a.add_argument("--src-file", help="source sentences, one per line (for --stats or --html)")
    a.add_argument("--tgt-file", help="their targets (default: greedy translations)")
    a.add_argument("--out", help="output file (default attention.png / attention.html); with several kinds "
                                 "the kind is added to the name")
    add_device_option(a, "cpu")
    a.add_argument("--force", action="store_true", help="overwrite existing outputs")


def _out(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--out", default=default, help="output file")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")


def cmd_plot(args, overrides: list[str]) -> None:
    PLOTS[args.what](args, overrides)


def _new(path: str | Path, force: bool) -> Path:
    from attnkit.io import ensure_new_output

    return ensure_new_output(path, force, "output file")


# --- attention --------------------------------------------------------------------------------
def _sentences(args) -> tuple[list[str], list[str] | None]:
    from attnkit.data import read_lines, read_parallel

    if args.src_file:
        if args.tgt_file:
            src, tgt = read_parallel(args.src_file, args.tgt_file)
            return src, tgt
        return read_lines(args.src_file), None
    if args.src is None:
        raise AttnkitError("plot attention: give --src \"a sentence\" (or --src-file F)")
    return [args.src], None if args.tgt is None else [args.tgt]


def plot_attention_cmd(args, overrides: list[str]) -> None:
    from attnkit.viz.attention import KIND_NAMES, load_views

    if args.stats:
        return attention_stats_cmd(args)
    sources, targets = _sentences(args)
    if args.html:
        return explorer_cmd(args, sources, targets)
    n = min(len(sources), HTML_SENTENCES) if args.bertviz else 1
    views = load_views(args.checkpoint, sources[:n], None if targets is None else targets[:n], args.device,
                       mem_len=args.mem_len)
    if args.bertviz:
        _save_bertviz(args, views)
    view = views[0]
    kinds = list(view.maps) if args.kind == "all" else [KIND_NAMES[args.kind]]
    for kind in kinds:  # a kind the model lacks is the mistake to report, before any existing output
        view.layers(kind)
    outs = _kind_paths(Path(args.out or "attention.png"), kinds)
    for out in outs.values():
        _new(out, args.force)
    from attnkit.viz.attention import plot_attention

    print(f"source: {view.source}\noutput: {view.output}")
    if view.note:
        print(f"attention: {view.note}")
    for kind, m in view.boundary.items():
        print(f"{kind}: {m} memory tokens | {len(view.queries[kind])} segment tokens")
    for kind, out in outs.items():
        plot_attention(view, kind, out, args.layer)
        print(f"wrote {out}")


def explorer_cmd(args, sources: list[str], targets: list[str] | None) -> None:
    """The explorer page of up to HTML_SENTENCES inputs: translations searched with --beam / --nbest (each
    hypothesis with its attention), or the given targets, or a language model's texts."""
    from attnkit.config import family
    from attnkit.decode import DecodeOptions, Translator
    from attnkit.viz.attention import checkpoint_kind, load_views, translation_views
    from attnkit.viz.explorer import write_explorer

    out = _new(args.out or "attention.html", args.force)
    n = min(len(sources), HTML_SENTENCES)
    kind = checkpoint_kind(args.checkpoint[0])
    task = "lm" if family(kind).task == "lm" else "translation"
    if targets is None and (args.beam > 1 or args.nbest > 1):
        if task == "lm":
            raise AttnkitError("--beam and --nbest are for translation models; a language model reads its text")
        if args.nbest > args.beam:
            raise AttnkitError(f"--nbest {args.nbest} is more than --beam {args.beam}")
        translator = Translator.from_checkpoints(args.checkpoint, device=args.device)
        items = translation_views(translator, sources[:n], DecodeOptions(beam=args.beam, nbest=args.nbest))
    else:
        items = [[v] for v in load_views(args.checkpoint, sources[:n], None if targets is None else targets[:n],
                                         args.device, mem_len=args.mem_len)]
    note = items[0][0].note
    title = f"attention of {', '.join(Path(p).name for p in args.checkpoint)}" + (f" ({note})" if note else "")
    model = f"ensemble of {len(args.checkpoint)} checkpoints (the first: {kind})" if len(args.checkpoint) > 1 else kind
    write_explorer(items, out, title=title, model=model, task=task)
    print(f"wrote {out} ({n} input{'s' * (n > 1)})")
    if args.bertviz:
        _save_bertviz(args, [hyps[0] for hyps in items])


def _save_bertviz(args, views) -> None:
    from attnkit.viz.explorer import save_bertviz

    for path in save_bertviz(views, _new(args.bertviz, args.force)):
        print(f"wrote {path} (bertviz: head_view(**torch.load(path)))")


def _kind_paths(out: Path, kinds: list[str]) -> dict[str, Path]:
    if len(kinds) == 1:
        return {kinds[0]: out}
    return {k: out.with_name(f"{out.stem}-{k}{out.suffix or '.png'}") for k in kinds}


def attention_stats_cmd(args) -> None:
    from attnkit.config import family
    from attnkit.viz.attention import checkpoint_kind, load_views
    from attnkit.viz.stats import diagonal_stats

    if args.html:
        raise AttnkitError("--stats prints a table; draw the --html page in a separate call")
    kind = checkpoint_kind(args.checkpoint[0])
    if family(kind).task == "lm":
        raise AttnkitError(f"--stats measures how diagonal encoder-decoder attention is; a {kind} language model "
                           "has none (draw its self-attention without --stats)")
    if args.mem_len is not None:
        raise AttnkitError("--mem-len is for language models; --stats takes seq2seq checkpoints")
    sources, targets = _sentences(args)
    views = load_views(args.checkpoint, sources, targets, args.device)
    print(f"targets: {'--tgt-file' if targets is not None else 'greedy translations'}")
    if views[0].note:
        print(f"attention: {views[0].note}")
    print(diagonal_stats(views, "cross").table())


# --- the other pictures -----------------------------------------------------------------------
def plot_decoding_cmd(args, overrides: list[str]) -> None:
    from attnkit.decode import Translator
    from attnkit.viz.decoding import decoding_trace, plot_decoding

    out = _new(args.out, args.force)
    trace = decoding_trace(Translator.from_checkpoint(args.checkpoint, device=args.device), args.src, args.tgt)
    print(f"{'pos':>3}  {'inference reads':<16} {'-> chooses':<16} {'teacher forcing reads':<22} "
          f"{'-> chooses':<16} max |d log p|")
    for i, gap in enumerate(trace.gaps()):
        cells = trace.label([trace.step_inputs[i], trace.step_outputs[i], trace.forced_inputs[i],
                             trace.forced_outputs[i]])
        print(f"{i + 1:>3}  {cells[0]:<16} {cells[1]:<16} {cells[2]:<22} {cells[3]:<16} {gap:.1e}")
    print("\n".join(trace.summary()))
    plot_decoding(trace, out)
    print(f"wrote {out}")


def plot_positions_cmd(args, overrides: list[str]) -> None:
    from attnkit.viz.positions import plot_positions

    plot = plot_positions(_new(args.out, args.force), args.d_model, args.positions, linear=args.linear,
                          offset=args.offset, fit_positions=args.fit_positions)
    if args.linear:
        res = plot.data["residuals"]
        print(f"least-squares map PE(p) -> PE(p + k) over {args.fit_positions} positions, relative residual for "
              f"k = 1..{res['offsets'][-1]}: sinusoidal {res['sinusoid'].min():.1e}..{res['sinusoid'].max():.1e}, "
              f"random table {res['random'].min():.2f}..{res['random'].max():.2f}; k = {args.offset}: the fitted "
              f"map is the block rotation R_k to {plot.data['map_error']:.0e} on the first dimensions")
    print(f"wrote {args.out}")


def schedule_from_args(args, overrides: list[str]):
    """(the learning rate as a function of the update, resolved run config, updates to draw) from presets,
    explicit options and dotted overrides. A schedule over the time budget (train.horizon=time) is drawn as
    training computes it, from the share of the budget spent, with updates at a steady rate and the budget
    ending at the last drawn update (its real length in updates depends on the machine)."""
    from attnkit import config as cfgmod
    from attnkit.train.schedules import make_schedule

    explicit = {"train.schedule": args.schedule, "train.lr": args.lr, "train.warmup": args.warmup,
                "model.d_model": args.d_model, "train.max_steps": args.total}
    overrides = list(overrides) + [f"{k}={v}" for k, v in explicit.items() if v is not None]
    cfg = cfgmod.resolve(args.config, overrides)
    t = cfg.train
    steps = args.steps or t.max_steps or 10 * t.warmup
    by_time = t.horizon == "time"
    fn = make_schedule(t.schedule, lr=t.lr, warmup=t.warmup, d_model=cfg.model.d_model, total=t.max_steps,
                       by_time=by_time, cooldown_fraction=t.cooldown)
    if by_time:
        return (lambda step: fn(step, spent=step / steps)), cfg, steps
    return fn, cfg, steps


def plot_schedule_cmd(args, overrides: list[str]) -> None:
    from attnkit.viz.curves import plot_schedule

    fn, cfg, steps = schedule_from_args(args, overrides)
    t = cfg.train
    notes = [f"cooldown: the last {t.cooldown:.0%}"] * bool(t.cooldown)
    notes += ["the time budget drawn as these updates"] * (t.horizon == "time")
    title = "\n".join([f"{t.schedule}: lr {'d_model^-0.5 (paper)' if t.lr is None else t.lr}, warmup {t.warmup}, "
                       f"d_model {cfg.model.d_model}", *notes])
    plot_schedule(fn, steps, _new(args.out, args.force), title=title)
    print(f"wrote {args.out}")


def plot_curves_cmd(args, overrides: list[str]) -> None:
    from attnkit.viz.curves import plot_curves

    x_axes = ("step", "time") if args.x == "both" else (args.x,)
    plot_curves(args.runs, _new(args.out, args.force), x_axes=x_axes)
    print(f"wrote {args.out}")


def plot_crossing_cmd(args, overrides: list[str]) -> None:
    import math

    from attnkit.experiments.lm_ablation import curve_group
    from attnkit.viz.curves import plot_crossing

    _, crossings = plot_crossing([curve_group(Path(d)) for d in args.ablations], _new(args.out, args.force))
    print("| corpus | model | baseline | model ahead from (min) | last valid, model | baseline | at min |")
    print("|---|---|---|---:|---:|---:|---:|")
    for c in crossings:
        ahead = f"{c.minute:.1f}" if math.isfinite(c.minute) else "not within the runs"
        print(f"| {c.group} | {c.model} | {c.baseline} | {ahead} | {c.model_last:.4g} | {c.baseline_last:.4g} | "
              f"{c.minutes:.1f} |")
    print(f"wrote {args.out}")


def plot_softmax_cmd(args, overrides: list[str]) -> None:
    from attnkit.viz.softmax import plot_softmax

    if args.max_dk < 1 or args.keys < 2 or args.samples < 2:
        raise AttnkitError("plot softmax: --max-dk >= 1, --keys >= 2 and --samples >= 2")
    d_ks = tuple(2**i for i in range(args.max_dk.bit_length()))
    plot = plot_softmax(_new(args.out, args.force), d_ks, args.keys, args.samples, args.seed)
    s, table = plot.data, plot.data["two_to_one_table"]
    print(f"d_k {s['d_k'][-1]}: Var(q.k) {s['var_raw'][-1]:.0f} unscaled, {s['var_scaled'][-1]:.2f} scaled; largest "
          f"softmax prob. {s['pmax_raw'][-1]:.2f} / {s['pmax_scaled'][-1]:.2f}; Jacobian norm {s['jac_raw'][-1]:.2g} / "
          f"{s['jac_scaled'][-1]:.2g}")
    print("logits [a, a, 2a]: " + ", ".join(f"a={a:g}: p {p:.4f}, |J| {j:.1e}"
                                            for a, p, j in zip(table["a"], table["pmax"], table["jac"])))
    print(f"wrote {args.out}")


def plot_order_cmd(args, overrides: list[str]) -> None:
    from attnkit.viz.order import LABELS, plot_order_blindness

    plot = plot_order_blindness(_new(args.out, args.force), args.src, checkpoint=args.checkpoint, layer=args.layer,
                                head=args.head, seed=args.seed)
    d = plot.data
    print(f"tokens: {' '.join(d['tokens'])}\nshuffle: {' '.join(d['tokens'][i] for i in d['order'])}")
    gaps = ", ".join(f"{LABELS[name]} {d[f'{name}_max_difference']:.2g}" for name in d["compared"])
    print(f"encoder layer {d['layer']}, head {d['head']}: largest difference between the sentence's map and its "
          f"shuffle's (put back): {gaps}")
    print(f"wrote {args.out}")


def plot_report_cmd(args, overrides: list[str]) -> None:
    from attnkit.viz.report import write_report

    out = _new(args.out or Path(args.run) / "report.html", args.force)
    print(f"wrote {write_report(args.run, out, data_dir=args.data, n_samples=args.samples)}")


PLOTS = {"attention": plot_attention_cmd, "decoding": plot_decoding_cmd, "positions": plot_positions_cmd,
         "order": plot_order_cmd, "schedule": plot_schedule_cmd, "curves": plot_curves_cmd,
         "crossing": plot_crossing_cmd, "softmax": plot_softmax_cmd, "report": plot_report_cmd}
