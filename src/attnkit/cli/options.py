"""Options several verbs share (checkpoints, devices, training runs, decoding, dotted config overrides),
and the parser every verb is built with: help shows defaults, usage errors are one line."""

from __future__ import annotations

import argparse
import os
import textwrap

from attnkit.errors import AttnkitError
from attnkit.presets import preset_names

SECTIONS = ("model.", "train.")
OVERRIDES_HELP = textwrap.fill(
    "config overrides: set any field of the config after the presets with --model.FIELD=VALUE or "
    "--train.FIELD VALUE, e.g. --train.lr=5e-4 --model.dropout 0.3. `attnkit presets NAME` prints every "
    "field of a preset (and so every name an override can take).", width=78)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and adds "(default: X)" to options whose help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        silent = action.required or any(action.default is x for x in (None, False, argparse.SUPPRESS)) \
            or action.default == []
        if silent or "default" in text or action.nargs == 0:
            return text
        return f"{text} (default: %(default)s)"

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Option help wrapped at spaces only: a preset name (lm-char-small-xl) or a flag stays whole on one line."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line that points at --help, with exit code 2."""

    def __init__(self, *args, **kw) -> None:
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def text(value: str) -> str:
    """An option that is text to read (`--prompt`, `--src "a sentence"`), read as UTF-8 as every file is, whatever
    the locale says. Python decodes a command line with the locale's encoding (a C locale's ASCII, Latin-1), bytes
    it cannot decode kept as surrogates U+DC80..U+DCFF (surrogateescape): os.fsencode gives the bytes back whole.
    Bytes that are not UTF-8 (another encoding, a lone surrogate's b"\\xed\\xa0\\x80") are refused in one usage
    line, as a file holding them is: no tokenizer, page or terminal could take them."""
    try:
        raw = os.fsencode(value)
    except UnicodeEncodeError:  # not the bytes of a command line: a string main() was given in Python
        for i, char in enumerate(value, start=1):
            if "\ud800" <= char <= "\udfff":
                raise argparse.ArgumentTypeError(f"not valid Unicode (a lone surrogate at character {i})") from None
        return value
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None


def add_overrides(p: argparse.ArgumentParser) -> None:
    """The verb takes dotted config overrides; its help says how."""
    p.set_defaults(takes_overrides=True)
    p.epilog = OVERRIDES_HELP


def add_config_option(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--config", action="append", default=[], metavar="PRESET|FILE",
                   help=f"YAML preset or file; repeat to layer them, later ones win (default: {default}). "
                        f"Presets: {', '.join(preset_names())}; `attnkit presets` describes them")


def add_device_option(p: argparse.ArgumentParser, default: str = "auto") -> None:
    p.add_argument("--device", default=default,
                   help="cpu, cuda, cuda:N or auto (auto: the first CUDA GPU if there is one, else the CPU)")


def add_quantize_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8: decode with int8 weights and inputs quantised per product (CPU with AVX2 or better; "
                        "elsewhere a warning says why and float32 runs); faster decoding for a rounding cost in BLEU "
                        "that docs/speed.md tables beside the speed")


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



def add_checkpoint_option(p: argparse.ArgumentParser, help: str = "a .safetensors checkpoint written by attnkit",
                          **kw) -> None:
    p.add_argument("--checkpoint", required=True, help=help, **kw)
    add_trust_option(p)


def add_trust_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="also load pickle / torch.save checkpoints, which can run code: only files you trust")


def add_train_options(t: argparse.ArgumentParser, prepared_by: str, default_config: str, trains: str) -> None:
    """The options every training verb shares; it also takes dotted config overrides. `trains`: "translation" or
    "lm", what the verb trains (the process is tuned for it: `attnkit.cpu.bound_kernel_caches`)."""
    t.set_defaults(trains=trains)
    add_overrides(t)
    t.add_argument("--data", required=True, help=f"folder written by `{prepared_by}`")
    t.add_argument("--out", required=True, help="run folder (checkpoints, logs, config)")
    add_config_option(t, default_config)
    t.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoints/last.safetensors with the run's own recipe (its config, "
                        "unless --config is given) on the data it was trained on; overrides may change the budget "
                        "(train.max_epochs, max_steps, max_minutes) and the bookkeeping")
    t.add_argument("--change-recipe", action="store_true",
                   help="with --resume: accept a --config or overrides that change the recipe (model, batching, "
                        "schedule); the changes are written to train.log")
    t.add_argument("--force", action="store_true", help="start over in a folder that holds a run")
    t.add_argument("--quiet", action="store_true", help="no progress bars")


def train_config(args, overrides: list[str], default_preset: str, cls: type | None = None):
    """The config a training verb runs: --resume without --config continues the run's own (train.base.run_config),
    else the presets (`default_preset` when none is named) with the overrides."""
    from attnkit import config as cfgmod
    from attnkit.train.base import run_config

    if args.change_recipe and not args.resume:
        raise AttnkitError("--change-recipe changes a resumed run's recipe: it needs --resume")
    if args.resume and not args.config:
        return run_config(args.out, overrides)
    return cfgmod.resolve(args.config or [default_preset], overrides, cls=cls)


def add_decode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search")
    g.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    g.add_argument("--nbest", type=int, default=1, help="hypotheses to output per sentence")
    g.add_argument("--lenpen", type=float, default=1.0, help="length penalty alpha for beam ranking")
    g.add_argument("--len-style", choices=["length", "gnmt"], default="length",
                   help="length: score / |Y|^alpha; gnmt: score / ((5+|Y|)/6)^alpha")
    g.add_argument("--min-len", type=int, default=0, help="end-of-sentence is blocked before this many tokens")
    g.add_argument("--max-len-a", type=float, help="output limit a*|src| + b (default: the checkpoint's)")
    g.add_argument("--max-len-b", type=int, help="b of the output limit a*|src| + b (default: the checkpoint's)")
    g.add_argument("--max-len", type=int, default=0, help="at most this many output tokens (0: a*|src| + b alone)")
    g.add_argument("--no-repeat-ngram", type=int, default=0, help="block repeated n-grams of this size")
    g.add_argument("--sampling", action="store_true", help="sample instead of searching")
    add_sampling_options(g)


def add_sampling_options(g) -> None:
    g.add_argument("--temperature", type=float, default=1.0, help="sampling: divide the logits by this")
    g.add_argument("--top-k", type=int, default=0, help="sampling: draw from the k most likely tokens (0: all)")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="sampling: draw from the smallest set of tokens holding this much probability (nucleus)")
    g.add_argument("--seed", type=int, default=0, help="sampling: the random seed (same seed, same samples)")


def decode_options(args):
    from attnkit.decode import DecodeOptions  # here: the CLI imports torch only when a verb runs

    return DecodeOptions(beam=args.beam, nbest=args.nbest, sampling=args.sampling, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, seed=args.seed, len_penalty=args.lenpen,
                         len_style=args.len_style, min_len=args.min_len, max_len_a=args.max_len_a,
                         max_len_b=args.max_len_b, max_len=args.max_len, no_repeat_ngram=args.no_repeat_ngram,
                         attention_layer=args.alignment_layer - 1 if getattr(args, "alignment_layer", 0) > 0 else -1)
