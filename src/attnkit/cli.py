"""The `attnkit` command: parses arguments and calls one function per verb.

Config overrides are dotted: `attnkit train ... --model.d_model=256 --train.lr 1e-3`.
User mistakes print one line `attnkit: error: ...` and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from attnkit.errors import AttnkitError

SECTIONS = ("model.", "train.")


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

    t = sub.add_parser("train", help="train a Transformer on a prepared corpus")
    t.add_argument("--data", required=True, help="folder written by `attnkit prepare`")
    t.add_argument("--out", required=True, help="run folder (checkpoints, logs, config)")
    t.add_argument("--config", action="append", default=[], metavar="PRESET|FILE",
                   help="YAML preset name or file; repeat to layer (default: transformer-small)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints/last.safetensors")
    t.add_argument("--force", action="store_true", help="start over in a folder that holds a run")
    t.add_argument("--quiet", action="store_true", help="no progress bars")

    tr = sub.add_parser("translate", help="translate text with a checkpoint (greedy, KV cache)")
    tr.add_argument("--checkpoint", required=True)
    tr.add_argument("--input", default="-", help="file (plain or .gz) or - for stdin")
    tr.add_argument("--output", default="-", help="file or - for stdout")
    tr.add_argument("--batch-size", type=int, default=64)
    tr.add_argument("--device", default="auto")
    tr.add_argument("--force", action="store_true", help="overwrite an existing output file")

    e = sub.add_parser("evaluate", help="sacreBLEU (cased + lowercased) and chrF of a hypothesis file")
    e.add_argument("--hyp", required=True)
    e.add_argument("--ref", required=True)
    return p


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
    trainer = Trainer(cfg, args.data, args.out, resume=args.resume, force=args.force, progress=not args.quiet)
    metrics = trainer.fit()
    print(" | ".join(f"{k} {v:.3f}" for k, v in metrics.items()) or "no dev set: no metrics")
    print(f"checkpoints: {trainer.last_path.parent}")


def cmd_translate(args, overrides: list[str]) -> None:
    from attnkit.data import read_lines
    from attnkit.decode import Translator
    from attnkit.io import atomic_write_text, ensure_new_output

    if args.output != "-":
        ensure_new_output(args.output, args.force, "output file")
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    lines = sys.stdin.read().splitlines() if args.input == "-" else read_lines(args.input)
    text = "".join(t + "\n" for t in translator.translate_texts(lines, batch_size=args.batch_size))
    if args.output == "-":
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)


def cmd_evaluate(args, overrides: list[str]) -> None:
    from attnkit.data import read_lines
    from attnkit.eval import score_corpus

    scores = score_corpus(read_lines(args.hyp), read_lines(args.ref))
    print(scores.summary())
    print(f"BLEU signature: {scores.signature}\nlowercased:     {scores.signature_lc}")


COMMANDS = {"demo": cmd_demo, "prepare": cmd_prepare, "train": cmd_train, "translate": cmd_translate,
            "evaluate": cmd_evaluate}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = build_parser()
    try:
        rest, overrides = split_overrides(argv)
        args = parser.parse_args(rest)
        if overrides and args.verb not in ("train", "demo"):
            raise AttnkitError(f"config overrides ({overrides[0]}) only apply to train and demo")
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            COMMANDS[args.verb](args, overrides)
    except AttnkitError as e:
        print(f"attnkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
