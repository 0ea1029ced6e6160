"""Two versions of attnkit on one workload, taking turns on one machine: the ratio, its spread and the peak RSS.

    python benchmarks/ab.py main HEAD --bench mt-train mt-greedy mt-beam5 mt-base-greedy mt-base-beam5 opus
    python benchmarks/ab.py main HEAD --train multi30k --steps 300
    python benchmarks/ab.py main HEAD --train lm-word-wt2 --steps 300 --rounds 8
    python benchmarks/ab.py main HEAD --train multi30k --minutes 60 --rounds 1     # a whole preset's budget

BEFORE and AFTER are each a git revision (checked out into a worktree of its own under --scratch) or the folder of
another checkout (one holding src/attnkit). Every measurement runs in a fresh process whose PYTHONPATH is that
version's src/, so nothing is installed. The rounds take turns, the order swapping every round (before-after,
after-before, ...), so a drift of the machine's speed over the run falls on both sides alike.

- `--bench W ...`: `attnkit bench --workloads W ... --peers` (attnkit alone, float32 and int8 where it decodes) from
  each version, one bench round per round. Compared: every attnkit row's tok/s, and the matmul peak as a control
  (the machine's own speed, which no version changes).
- `--train PRESET --steps N`: N updates of the preset as that version writes it (only the update count set), on
  the preset's data prepared from ../shared/data by that version's own code (the prepared format may differ between
  versions). Compared: the mean update time over updates 50 to N (metrics.csv), as a speed ratio.
- `--train PRESET --minutes M`: the preset's budget set to M minutes. Compared: the updates made, and the best dev
  figure (BLEU, or perplexity for a language model) printed beside them.

Each row gives both sides' figures, the ratio AFTER ÷ BEFORE (for a time, BEFORE ÷ AFTER: above 1 is faster) as the
geometric mean of the rounds' own ratios, its 95% t interval over the rounds and their range, and the peak RSS of
each side (the largest over the rounds: `wait4`'s ru_maxrss of the measuring process, or the bench's own figure),
with its ratio. The last line is the geometric mean of the ratios of the attnkit rows and the smallest of them.
Run it alone on the machine; --out FILE also writes the table (markdown).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
# Student's t, 97.5% quantile, for 1 .. 15 degrees of freedom (a 95% two-sided interval)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)


@dataclass
class Figure:
    """One compared quantity: each round's value and peak RSS (MiB) per side."""

    name: str
    higher_is_better: bool = True
    values: dict[str, list[float]] = field(default_factory=lambda: {"before": [], "after": []})
    rss: dict[str, list[float]] = field(default_factory=lambda: {"before": [], "after": []})
    note: dict[str, list[str]] = field(default_factory=lambda: {"before": [], "after": []})
    control: bool = False  # the machine's own speed: shown, not counted in the summary


def ratios(fig: Figure) -> list[float]:
    """The rounds' own ratios, oriented so that above 1 means AFTER is better."""
    pairs = zip(fig.values["before"], fig.values["after"])
    return [a / b if fig.higher_is_better else b / a for b, a in pairs if a > 0 and b > 0]


def spread(rs: list[float]) -> tuple[float, float, float]:
    """The geometric mean of `rs` and its 95% t interval (the mean itself twice for a single round)."""
    logs = [math.log(r) for r in rs]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    half = T975[min(len(logs) - 2, len(T975) - 1)] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def table(figures: list[Figure], before: str, after: str) -> str:
    """The comparison as markdown, with the summary line under it."""
    out = [f"before: {before} · after: {after}", "",
           "| figure | before | after | after ÷ before | 95% interval | range | peak RSS MiB, before → after |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    counted = []
    for fig in figures:
        rs = ratios(fig)
        if not rs:
            out.append(f"| {fig.name} | — | — | — | | | |")
            continue
        mean, low, high = spread(rs)
        if not fig.control:
            counted.append(mean)
        b, a = (" / ".join(f"{v:,.1f}" for v in fig.values[s]) for s in ("before", "after"))
        rb, ra = (max(fig.rss[s]) if fig.rss[s] else float("nan") for s in ("before", "after"))
        rss = f"{rb:,.0f} → {ra:,.0f} ({ra / rb:.3f}×)" if fig.rss["before"] and fig.rss["after"] else "—"
        name = f"{fig.name} (control)" if fig.control else fig.name
        out.append(f"| {name} | {b} | {a} | **{mean:.3f}×** | {low:.3f}-{high:.3f}× | {min(rs):.3f}-{max(rs):.3f}× "
                   f"| {rss} |")
        for side in ("before", "after"):
            if any(fig.note[side]):
                out.append(f"| ↳ {side} | {'; '.join(fig.note[side])} | | | | | |")
    if counted:
        geo = math.exp(statistics.fmean(math.log(r) for r in counted))
        out += ["", f"{len(counted)} figures: geometric mean of the ratios **{geo:.3f}×**, "
                    f"smallest {min(counted):.3f}×"]
    return "\n".join(out) + "\n"


# --- the two versions ---------------------------------------------------------------------------------------------


def checkout(spec: str, where: Path) -> Path:
    """The source tree of `spec`: a checkout's folder as it is, else a worktree of the revision at `where`."""
    if (Path(spec) / "src" / "attnkit").is_dir():
        return Path(spec).resolve()
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(where), spec],
                          capture_output=True, text=True)
    if made.returncode:
        raise SystemExit(f"{spec}: neither a checkout's folder nor a git revision ({last_line(made.stderr)})")
    return where.resolve()


def last_line(text: str) -> str:
    """The last line of a command's output that says something (its error, usually)."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "no output")


def failed(side: str, what: str, code: int, log: Path) -> SystemExit:
    """The one-line error for a step of `side` that exited with `code`: its log's last line and where the log is."""
    return SystemExit(f"{side}: {what} exited with {code}: {last_line(log.read_text(errors='replace'))} ({log})")


def describe(tree: Path) -> str:
    """The commit a tree is at, for the table's first line."""
    got = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return got.stdout.strip()[:80] or str(tree)


def attnkit(tree: Path, args: list[str], log: Path) -> tuple[int, float]:
    """`python -m attnkit ARGS` with `tree`'s sources; its exit status and its peak RSS (MiB, from wait4)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "attnkit", *args], env=env, cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024  # Linux: KiB


# --- the workloads ------------------------------------------------------------------------------------------------


def prepare_args(preset: str) -> tuple[str, list[str]]:
    """The data folder's name for `preset` and the command that prepares it from ../shared/data (docs/results.md)."""
    m30k, wt2, tat = SHARED / "multi30k", SHARED / "wikitext-2", SHARED / "tatoeba-cmn-eng"
    ts = SHARED / "tiny_shakespeare"
    if preset.startswith("tatoeba-"):
        src, tgt = preset.removeprefix("tatoeba-").split("-")
        return preset, ["prepare", "--src", src, "--tgt", tgt, "--train", f"{tat}/train", "--valid", f"{tat}/dev",
                        "--test", f"{tat}/test", "--vocab-size", "8000", "--normalization", "identity",
                        "--character-coverage", "1.0"]
    if preset.startswith("lm-word-wt2"):
        return "wt2", ["lm", "prepare", "--train", f"{wt2}/wiki.train.tokens.gz", "--valid",
                       f"{wt2}/wiki.valid.tokens.gz", "--test", f"{wt2}/wiki.test.tokens.gz", "--level", "word"]
    if preset.startswith("lm-char"):
        return "shakespeare", ["lm", "prepare", "--train", f"{ts}/input.txt.gz", "--valid-fraction", "0.1",
                               "--level", "char"]
    return "multi30k", ["prepare", "--src", "de", "--tgt", "en", "--train", f"{m30k}/train", "--valid",
                        f"{m30k}/val", "--test", f"{m30k}/test_2016_flickr", "--vocab-size", "8000"]


def step_ms(metrics: Path, first: int = 50) -> float:
    """The mean update time (ms) from the first training row at or after update `first` to the last one."""
    with open(metrics, encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
    times = {int(r["step"]): float(r["elapsed_s"]) for r in rows}
    start = min((s for s in times if s >= first), default=min(times))
    last = max(times)
    if last == start:
        raise SystemExit(f"{metrics}: no training rows after update {first}; ask for more --steps")
    return 1e3 * (times[last] - times[start]) / (last - start)


def budget_figures(metrics: Path) -> tuple[int, float | None, str]:
    """Updates made, the best dev figure and its name (BLEU, higher; else perplexity, lower) from metrics.csv."""
    with open(metrics, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    updates = max(int(r["step"]) for r in rows if r["step"])
    dev = [r for r in rows if r["split"] == "valid"]
    for key, best in (("bleu", max), ("ppl", min)):
        got = [float(r[key]) for r in dev if r.get(key)]
        if got:
            return updates, best(got), key
    return updates, None, ""


def run_train(tree: Path, side: str, preset: str, args, scratch: Path, fig: Figure) -> None:
    """One training run of `preset` with `tree`'s code; its figure and peak RSS appended to `fig`."""
    name, prepare = prepare_args(preset)
    data = scratch / f"data-{side}" / name
    if not data.is_dir():
        data.parent.mkdir(parents=True, exist_ok=True)
        code, _ = attnkit(tree, [*prepare, "--out", str(data)], scratch / f"prepare-{side}.log")
        if code:
            raise failed(side, f"preparing {name}", code, scratch / f"prepare-{side}.log")
    verb = ["lm", "train"] if preset.startswith("lm-") else ["train"]
    budget = [f"--train.max_minutes={args.minutes}"] if args.minutes else [f"--train.max_steps={args.steps}"]
    out, log = scratch / f"run-{side}", scratch / f"train-{side}.log"
    code, rss = attnkit(tree, [*verb, "--config", preset, "--data", str(data), "--out", str(out), "--quiet",
                               "--force", *budget], log)
    if code:
        raise failed(side, "training", code, log)
    if args.minutes:
        updates, dev, key = budget_figures(out / "metrics.csv")
        fig.values[side].append(updates)
        fig.note[side].append(f"best dev {key} {dev:.2f}" if dev is not None else "no dev figure")
    else:
        fig.values[side].append(step_ms(out / "metrics.csv"))
    fig.rss[side].append(rss)


def run_bench(tree: Path, side: str, args, scratch: Path, figures: dict[str, Figure]) -> None:
    """One `attnkit bench` round with `tree`'s code; each attnkit row's tok/s and the matmul peak into `figures`."""
    out, log = scratch / f"bench-{side}.jsonl", scratch / f"bench-{side}.log"
    code, _ = attnkit(tree, ["bench", "--workloads", *args.bench, "--peers", "--dtype", args.dtype, "--json",
                             str(out), "--force"], log)
    if code:
        raise failed(side, "attnkit bench", code, log)
    for line in out.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["toolkit"] == "machine":
            fig = figures.setdefault("matmul peak GFLOP/s", Figure("matmul peak GFLOP/s", control=True))
            fig.values[side].append(row["gflop_s"])
        elif row["toolkit"].startswith("attnkit") and row.get("tok_s"):
            name = f"{row['workload']} ({row['toolkit']}) tok/s"
            fig = figures.setdefault(name, Figure(name))
            fig.values[side].append(row["tok_s"])
            fig.rss[side].append(row["peak_rss_mb"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", help="a git revision, or the folder of another checkout")
    ap.add_argument("after", help="a git revision, or the folder of another checkout")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--bench", nargs="+", metavar="WORKLOAD", help="attnkit bench workloads or groups")
    what.add_argument("--train", metavar="PRESET", help="a training preset (multi30k, lm-word-wt2, tatoeba-zh-en ...)")
    ap.add_argument("--steps", type=int, default=300, help="--train: updates a run (default 300)")
    ap.add_argument("--minutes", type=float, help="--train: the preset's budget in minutes instead of --steps")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="--bench: its --dtype")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each side once a round (default 3)")
    ap.add_argument("--scratch", type=Path, default=ROOT / "runs" / "ab", help="worktrees, data and runs")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or (args.train and not args.minutes and args.steps <= 50):
        ap.error("--rounds must be at least 1 and --steps above 50 (the mean starts at update 50)")
    args.scratch.mkdir(parents=True, exist_ok=True)
    trees = {side: checkout(spec, args.scratch / f"tree-{side}")
             for side, spec in (("before", args.before), ("after", args.after))}
    figures: dict[str, Figure] = {}
    if args.train:
        what = "updates in the budget" if args.minutes else f"ms an update (50-{args.steps})"
        figures[args.train] = Figure(f"`{args.train}`, {what}", higher_is_better=bool(args.minutes))
    for r in range(args.rounds):
        for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
            print(f"round {r + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
            if args.train:
                run_train(trees[side], side, args.train, args, args.scratch, figures[args.train])
            else:
                run_bench(trees[side], side, args, args.scratch, figures)
    text = table(list(figures.values()), describe(trees["before"]), describe(trees["after"]))
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    for side in ("before", "after"):
        if trees[side].is_relative_to(args.scratch.resolve()):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[side])],
                           capture_output=True)


if __name__ == "__main__":
    main()
