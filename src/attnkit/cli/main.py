"""The `attnkit` command: parses arguments and calls one function per verb.

Config overrides are dotted: `attnkit train ... --model.d_model=256 --train.lr 1e-3`.
User mistakes print one line `attnkit: error: ...` and exit with code 2; attnkit's warnings print one line
`attnkit: warning: ...` and the command goes on.
Each verb group lives in its own module (seq2seq, translate, convert, export, lm, plot, experiment, bench, presets) and
imports torch and the models only when one of its verbs runs, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from attnkit import __version__
from attnkit.cli import bench, convert, experiment, export, lm, plot, presets, seq2seq, translate
from attnkit.cli.options import Parser, split_overrides
from attnkit.errors import AttnkitError
from attnkit.io import trust_pickle

VERB_GROUPS = (seq2seq, translate, convert, export, lm, plot, experiment, bench, presets)
DESCRIPTION = """\
attnkit trains, runs, measures and explains attention models: the encoder-decoder Transformer for
translation, Transformer-XL and vanilla Transformer language models, and the RNN encoder-decoders
that came before them (fixed vector, soft and hard attention).

First steps: `attnkit demo` trains a small German->English model in about 7 minutes on a CPU;
`attnkit VERB --help` tells what a verb does and every option it takes."""


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The parser of every verb, and verb -> the function that runs it."""
    p = Parser(prog="attnkit", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"attnkit {__version__}",
                   help="print attnkit's version and exit")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB", title="verbs")
    commands: dict = {}
    for group in VERB_GROUPS:
        commands.update(group.add_parsers(sub))
    return p, commands


def verbs_taking_overrides(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    """The verbs (`lm train` for nested ones) whose parsers accept dotted config overrides."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if child.get_default("takes_overrides"):
                    found.append(prefix + name)
                found += verbs_taking_overrides(child, f"{prefix}{name} ")
    return found


def tune_process(args: argparse.Namespace) -> None:
    """Process-wide settings that pay for one kind of work; the command owns its process, the library never."""
    trains = getattr(args, "trains", False)
    if trains or getattr(args, "keeps_freed_memory", False):  # the verbs that train or decode
        from attnkit.cpu import bound_kernel_caches, keep_freed_memory

        keep_freed_memory()
        if trains:
            bound_kernel_caches(trains)


ATTNKIT_SOURCE = Path(__file__).resolve().parents[1]  # the package's folder


def one_line_warning(show_other: Callable) -> Callable:
    """How the command shows a warning: attnkit's own as one line on stderr (`attnkit: warning: input 7 has ...`),
    without Python's category and source line; other libraries' warnings as Python shows them (`show_other`)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not Path(filename).resolve().is_relative_to(ATTNKIT_SOURCE):
            show_other(message, category, filename, lineno, file, line)
            return
        print(f"attnkit: warning: {' '.join(str(message).split())}", file=sys.stderr if file is None else file)

    return show


@contextlib.contextmanager
def utf8_output() -> Iterator[None]:
    """stdout and stderr write UTF-8 while the command runs, as attnkit reads UTF-8, whatever the locale says (a C
    locale's ASCII, Windows' code page when redirected): a prompt, a translation or a file name in any script prints
    rather than ending in a UnicodeEncodeError. Restored after, for a caller of main() in a process of its own."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if encoding and codecs.lookup(encoding).name != "utf-8" and hasattr(stream, "reconfigure"):
            changed.append((stream, encoding, stream.errors))
            stream.reconfigure(encoding="utf-8", errors=stream.errors)  # keeps surrogateescape's bytes as they came
    try:
        yield
    finally:
        for stream, encoding, errors in changed:
            stream.reconfigure(encoding=encoding, errors=errors)


def main(argv: list[str] | None = None) -> int:
    with utf8_output():
        return run(sys.argv[1:] if argv is None else [str(a) for a in argv])


def run(argv: list[str]) -> int:
    """The command of `argv` (the words after `attnkit`): its exit code."""
    parser, commands = build_parser()
    try:
        rest, overrides = split_overrides(argv)
        try:
            args = parser.parse_args(rest)
        except SystemExit as e:  # --help, --version, or a usage error argparse has already printed in one line
            return e.code if isinstance(e.code, int) else 0
        if overrides and not getattr(args, "takes_overrides", False):
            raise AttnkitError(f"config overrides (--{overrides[0]}) apply only to: "
                               + ", ".join(verbs_taking_overrides(parser)))
        tune_process(args)
        trust = trust_pickle.set(getattr(args, "trust_checkpoint", False))
        try:
            with warnings.catch_warnings():  # restores the filters and showwarning on the way out
                warnings.simplefilter("default")
                warnings.showwarning = one_line_warning(warnings.showwarning)
                commands[args.verb](args, overrides)
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
