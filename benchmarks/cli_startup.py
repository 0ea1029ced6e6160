"""CPU time of `attnkit --help` and of every verb's help, in fresh interpreters, for one or more checkouts.

    python benchmarks/cli_startup.py                     # this checkout
    python benchmarks/cli_startup.py --src OLD/src --src src --runs 20

Each command runs `--runs` times as `python -m attnkit ...` with PYTHONPATH set to the given source folder;
the CPU time (user + system) of each run comes from `resource.getrusage(RUSAGE_CHILDREN)` around it, and
the table shows the median, with plain `python -c pass` measured beside it as the interpreter's own cost.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

COMMANDS = (["-c", "pass"], ["-m", "attnkit", "--help"], ["-m", "attnkit", "translate", "--help"],
            ["-m", "attnkit", "train", "--help"], ["-m", "attnkit", "lm", "train", "--help"])


def cpu_seconds(argv: list[str], src: str) -> float:
    """User + system CPU time of one run of `python argv` with `src` first on the import path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    subprocess.run([sys.executable, *argv], env=env, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", action="append", help="a source folder holding the attnkit package (repeatable)")
    p.add_argument("--runs", type=int, default=10, help="runs per command (the median is reported)")
    args = p.parse_args()
    sources = args.src or ["src"]
    print("| command | " + " | ".join(f"CPU s, {s}" for s in sources) + " |")
    print("|---|" + "---:|" * len(sources))
    for argv in COMMANDS:
        medians = [statistics.median(cpu_seconds(argv, s) for _ in range(args.runs)) for s in sources]
        label = "python -c pass" if argv[0] == "-c" else "attnkit " + " ".join(argv[2:])
        print(f"| `{label}` | " + " | ".join(f"{m:.3f}" for m in medians) + " |")


if __name__ == "__main__":
    main()
