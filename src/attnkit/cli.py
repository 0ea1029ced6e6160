"""The `attnkit` command: parses arguments and calls one function per verb.

Config overrides are dotted: `attnkit train ... --model.d_model=256 --train.lr 1e-3`.
User mistakes print one line `attnkit: error: ...` and exit with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from attnkit.errors import AttnkitError
from attnkit.io import trust_pickle

SECTIONS = ("model.", "train.")
# Model families and tools that bring their own verbs: each module has
# `add_parsers(sub) -> {verb: function(args, overrides)}` and imports heavy modules lazily.
VERB_MODULES: tuple[str, ...] = ("attnkit.plot_cli", "attnkit.lm_cli", "attnkit.experiment_cli", "attnkit.bench_cli")


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Pull `--model.x=1` / `--train.y 2` overrides out of argv; the rest goes to argparse."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and arg[2:].startswith(SECTIONS):
            if "=" in arg:
                overrides.append(arg[2:])
            elif i + 1 < len(argv):
                overrides.append(f"{arg[2:]}={argv[i + 1]}")
                i += 1
            else:
                raise AttnkitError(f"override {arg} needs a value")
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnkit", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    d = sub.add_parser("demo", help="train and evaluate the built-in German->English number demo")
    d.set_defaults(takes_overrides=True)
    d.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    d.add_argument("--n-train", type=int, default=24000)
    d.add_argument("--n-eval", type=int, default=1000)
    d.add_argument("--force", action="store_true", help="overwrite an existing demo folder")
    d.add_argument("--quiet", action="store_true", help="no progress bars")

    pr = sub.add_parser("prepare", help="train a sentencepiece vocabulary and encode a parallel corpus")
    pr.add_argument("--src", required=True, help="source language suffix, e.g. de")
    pr.add_argument("--tgt", required=True, help="target language suffix, e.g. en")
    pr.add_argument("--train", required=True, help="file prefix: PREFIX.SRC and PREFIX.TGT (or .gz)")
    pr.add_argument("--valid", help="dev set prefix")
    pr.add_argument("--test", help="test set prefix")
    pr.add_argument("--out", required=True, help="folder for the vocabulary and encoded splits")
    pr.add_argument("--vocab-size", type=int, default=8000)
    pr.add_argument("--model-type", default="bpe", choices=["bpe", "unigram", "char", "word"])
    pr.add_argument("--separate-vocab", action="store_true", help="one vocabulary per language")
    pr.add_argument("--max-src-len", type=int, default=256, help="drop training pairs longer than this")
    pr.add_argument("--max-tgt-len", type=int, default=256)
    pr.add_argument("--force", action="store_true", help="overwrite an existing output folder")

    t = sub.add_parser("train", help="train a seq2seq model (Transformer, rnn-*) on a prepared corpus")
    add_train_options(t, "attnkit prepare", "transformer-small")

    tr = sub.add_parser("translate", help="translate text with a checkpoint: greedy, beam search or sampling")
    add_checkpoint_option(tr)
    tr.add_argument("--input", default="-", help="file (plain or .gz) or - for stdin")
    tr.add_argument("--output", default="-", help="file or - for stdout")
    tr.add_argument("--force", action="store_true", help="overwrite an existing output file")
    tr.add_argument("--interactive", action="store_true", help="read a line, answer at once, until EOF")
    tr.add_argument("--format", choices=["text", "tsv"], default="text",
                    help="text: one translation per line; tsv: line, rank, score, normalised score, text")
    tr.add_argument("--print-alignment", action="store_true",
                    help="append source-target index pairs (arg-max cross-attention) to each line")
    tr.add_argument("--alignment-layer", type=int, default=-1, help="decoder layer for alignments")
    tr.add_argument("--prefix-file", help="force each output to start with this file's line")
    add_decode_options(tr)
    tr.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    tr.add_argument("--max-tokens", type=int, default=0, help="source tokens per batch (0 = no limit)")
    tr.add_argument("--device", default="auto")

    sc = sub.add_parser("score", help="forced decoding: log P(target | source) for each line pair")
    add_checkpoint_option(sc)
    sc.add_argument("--src", required=True, help="source file")
    sc.add_argument("--tgt", required=True, help="target file, line-aligned with --src")
    sc.add_argument("--device", default="auto")

    av = sub.add_parser("average", help="average the weights of several checkpoints into a new one")
    av.add_argument("checkpoints", nargs="*", help="checkpoint files (or use --run and --last)")
    av.add_argument("--run", help="run folder whose epoch checkpoints to average")
    av.add_argument("--last", type=int, default=5, help="with --run: how many of the latest epochs")
    av.add_argument("--out", required=True, help="the averaged checkpoint to write")
    av.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_trust_option(av)

    sv = sub.add_parser("serve", help="an HTTP JSON translation service (FastAPI + uvicorn; extra 'serve')")
    add_checkpoint_option(sv)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--device", default="auto")
    sv.add_argument("--max-batch-sentences", type=int, default=64, help="sentences translated together")
    sv.add_argument("--max-request-sentences", type=int, default=64, help="larger requests get 413")
    sv.add_argument("--max-chars", type=int, default=1000, help="longer sentences get 413")
    sv.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long to gather concurrent requests")

    e = sub.add_parser("evaluate", help="sacreBLEU (cased + lowercased) and chrF of a hypothesis file")
    e.add_argument("--hyp", required=True)
    e.add_argument("--ref", required=True)
    for name in VERB_MODULES:
        COMMANDS.update(importlib.import_module(name).add_parsers(sub))
    return p


def add_checkpoint_option(p: argparse.ArgumentParser, **kw) -> None:
    p.add_argument("--checkpoint", required=True, help="a .safetensors checkpoint written by attnkit", **kw)
    add_trust_option(p)


def add_trust_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="also load pickle / torch.save checkpoints, which can run code: only files you trust")


def add_train_options(t: argparse.ArgumentParser, prepared_by: str, default_config: str) -> None:
    """The options every training verb shares; it also takes dotted config overrides."""
    t.set_defaults(takes_overrides=True)
    t.add_argument("--data", required=True, help=f"folder written by `{prepared_by}`")
    t.add_argument("--out", required=True, help="run folder (checkpoints, logs, config)")
    t.add_argument("--config", action="append", default=[], metavar="PRESET|FILE",
                   help=f"YAML preset name or file; repeat to layer (default: {default_config})")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints/last.safetensors")
    t.add_argument("--force", action="store_true", help="start over in a folder that holds a run")
    t.add_argument("--quiet", action="store_true", help="no progress bars")


def add_decode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search")
    g.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    g.add_argument("--nbest", type=int, default=1, help="hypotheses to output per sentence")
    g.add_argument("--lenpen", type=float, default=1.0, help="length penalty alpha for beam ranking")
    g.add_argument("--len-style", choices=["length", "gnmt"], default="length",
                   help="length: score / |Y|^alpha; gnmt: score / ((5+|Y|)/6)^alpha")
    g.add_argument("--min-len", type=int, default=0)
    g.add_argument("--max-len-a", type=float, help="output limit a*|src| + b (default: the checkpoint's)")
    g.add_argument("--max-len-b", type=int)
    g.add_argument("--no-repeat-ngram", type=int, default=0, help="block repeated n-grams of this size")
    g.add_argument("--sampling", action="store_true", help="sample instead of searching")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)


def decode_options(args):
    from attnkit.decode import DecodeOptions

    return DecodeOptions(beam=args.beam, nbest=args.nbest, sampling=args.sampling, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, seed=args.seed, len_penalty=args.lenpen,
                         len_style=args.len_style, min_len=args.min_len, max_len_a=args.max_len_a,
                         max_len_b=args.max_len_b, no_repeat_ngram=args.no_repeat_ngram,
                         attention_layer=args.alignment_layer if hasattr(args, "alignment_layer") else -1)


def cmd_demo(args, overrides: list[str]) -> None:
    from attnkit.demo import run_demo

    result = run_demo(args.out, overrides=overrides, n_train=args.n_train, n_eval=args.n_eval,
                      force=args.force, progress=not args.quiet)
    print(f"\ntest set: {result.scores.summary()}")
    print(result.scores.signature)
    for src, hyp, ref in result.samples:
        print(f"  {src}\n    -> {hyp}{'' if hyp == ref else f'   (reference: {ref})'}")
    print(f"attention heatmap: {result.heatmap}\ncheckpoint: {result.checkpoint}")


def cmd_prepare(args, overrides: list[str]) -> None:
    from attnkit.data import prepare, resolve_prefix

    def pair(prefix: str | None):
        return None if prefix is None else (resolve_prefix(prefix, args.src), resolve_prefix(prefix, args.tgt))

    report = prepare(args.out, pair(args.train), pair(args.valid), pair(args.test), vocab_size=args.vocab_size,
                     joint=not args.separate_vocab, model_type=args.model_type, max_src_len=args.max_src_len,
                     max_tgt_len=args.max_tgt_len, force=args.force)
    print(report.summary())
    print(f"wrote {args.out}")


def cmd_train(args, overrides: list[str]) -> None:
    from attnkit import config as cfgmod
    from attnkit.train.trainer import Trainer

    cfg = cfgmod.resolve(args.config or ["transformer-small"], overrides)
    if not isinstance(cfg, cfgmod.RunConfig):
        raise AttnkitError(f"--config {' '.join(args.config)} configures a '{cfg.model.kind}' language model: "
                           "train it with `attnkit lm train`")
    trainer = Trainer(cfg, args.data, args.out, resume=args.resume, force=args.force, progress=not args.quiet)
    metrics = trainer.fit()
    print(" | ".join(f"{k} {v:.3f}" for k, v in metrics.items()) or "no dev set: no metrics")
    print(f"checkpoints: {trainer.last_path.parent}")


def cmd_translate(args, overrides: list[str]) -> None:
    from attnkit.data import iter_lines, read_lines
    from attnkit.decode import Translator
    from attnkit.io import atomic_write_text, ensure_new_output

    if args.output != "-":
        ensure_new_output(args.output, args.force, "output file")
    opts = decode_options(args)
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    prefixes = read_lines(args.prefix_file) if args.prefix_file else None

    def render(lines: list[str], first: int = 0, prefixes: list[str] | None = None) -> str:
        results = translator.translate(lines, opts, prefixes=prefixes, batch_size=args.batch_size,
                                       max_tokens=args.max_tokens, need_attention=args.print_alignment)
        return "".join(format_translation(first + i, t, args) for i, t in enumerate(results))

    if args.interactive:
        for n, line in enumerate(iter_lines(sys.stdin)):
            sys.stdout.write(render([line], n))
            sys.stdout.flush()
        return
    lines = list(iter_lines(sys.stdin)) if args.input == "-" else read_lines(args.input)
    if prefixes is not None and len(prefixes) != len(lines):
        raise AttnkitError(f"--prefix-file has {len(prefixes)} lines but the input has {len(lines)}")
    text = render(lines, prefixes=prefixes)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)


def format_translation(index: int, t, args) -> str:
    """One line per hypothesis: plain text, or TSV with scores; alignments as `src-tgt` pairs."""
    out = []
    for rank, h in enumerate([t] + t.nbest):
        fields = [h.text] if args.format == "text" else [str(index), str(rank), f"{h.score:.4f}",
                                                         f"{h.norm_score:.4f}", h.text]
        if args.print_alignment:
            fields.append(" ".join(f"{s}-{j}" for j, s in enumerate(h.alignment)))
        out.append("\t".join(fields) + "\n")
    return "".join(out)


def cmd_score(args, overrides: list[str]) -> None:
    from attnkit.data import read_parallel
    from attnkit.decode import Translator

    src, tgt = read_parallel(args.src, args.tgt)
    for lp in Translator.from_checkpoint(args.checkpoint, device=args.device).score(src, tgt):
        print(f"{lp:.4f}")


def cmd_average(args, overrides: list[str]) -> None:
    from attnkit.io import ensure_new_output
    from attnkit.train.checkpoint import average_checkpoints, epoch_checkpoints

    ensure_new_output(args.out, args.force, "output file")
    paths = list(args.checkpoints) or (epoch_checkpoints(args.run)[-args.last :] if args.run else [])
    if not paths:
        raise AttnkitError("average: name checkpoint files, or --run DIR with epoch checkpoints")
    average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints into {args.out}: " + ", ".join(str(p) for p in paths))


def cmd_serve(args, overrides: list[str]) -> None:
    try:
        from attnkit.serve import serve
    except ImportError as e:
        raise AttnkitError(str(e)) from None
    serve(args.checkpoint, host=args.host, port=args.port, device=args.device,
          max_batch_sentences=args.max_batch_sentences, max_request_sentences=args.max_request_sentences,
          max_chars=args.max_chars, batch_wait_ms=args.batch_wait_ms)


def cmd_evaluate(args, overrides: list[str]) -> None:
    from attnkit.data import read_lines
    from attnkit.eval import score_corpus

    scores = score_corpus(read_lines(args.hyp), read_lines(args.ref))
    print(scores.summary())
    print(f"BLEU signature: {scores.signature}\nlowercased:     {scores.signature_lc}")


COMMANDS = {"demo": cmd_demo, "prepare": cmd_prepare, "train": cmd_train, "translate": cmd_translate,
            "score": cmd_score, "average": cmd_average, "serve": cmd_serve, "evaluate": cmd_evaluate}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = build_parser()
    try:
        rest, overrides = split_overrides(argv)
        args = parser.parse_args(rest)
        if overrides and not getattr(args, "takes_overrides", False):
            raise AttnkitError(f"config overrides ({overrides[0]}) only apply to verbs that train")
        trust = trust_pickle.set(getattr(args, "trust_checkpoint", False))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default")
                COMMANDS[args.verb](args, overrides)
        finally:
            trust_pickle.reset(trust)
    except AttnkitError as e:
        code = getattr(e, "exit_code", 2)  # 2: a usage error; 128 + N: training stopped by signal N
        print(f"attnkit: {'error: ' if code == 2 else ''}{e}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
