"""Options several verbs share: checkpoints, training runs, decoding, and dotted config overrides."""

from __future__ import annotations

import argparse

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



def add_checkpoint_option(p: argparse.ArgumentParser, **kw) -> None:
    p.add_argument("--checkpoint", required=True, help="a .safetensors checkpoint written by attnkit", **kw)
    add_trust_option(p)


def add_trust_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="also load pickle / torch.save checkpoints, which can run code: only files you trust")


def add_train_options(t: argparse.ArgumentParser, prepared_by: str, default_config: str) -> None:
    """The options every training verb shares; it also takes dotted config overrides."""
    t.set_defaults(takes_overrides=True, bounds_kernel_caches=True)
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
    g.add_argument("--max-len", type=int, default=0, help="at most this many output tokens (0: a*|src| + b alone)")
    g.add_argument("--no-repeat-ngram", type=int, default=0, help="block repeated n-grams of this size")
    g.add_argument("--sampling", action="store_true", help="sample instead of searching")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)


def decode_options(args):
    from attnkit.decode import DecodeOptions  # here: the CLI imports torch only when a verb runs

    return DecodeOptions(beam=args.beam, nbest=args.nbest, sampling=args.sampling, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, seed=args.seed, len_penalty=args.lenpen,
                         len_style=args.len_style, min_len=args.min_len, max_len_a=args.max_len_a,
                         max_len_b=args.max_len_b, max_len=args.max_len, no_repeat_ngram=args.no_repeat_ngram,
                         attention_layer=args.alignment_layer if hasattr(args, "alignment_layer") else -1)
