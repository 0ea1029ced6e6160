"""Peak memory of preparing and training against corpus size: the growth must be flat.

    python benchmarks/corpus_memory.py --out runs/scale [--sizes 1 4 16] [--steps 50]

Corpora: Multi30k's training pairs (translation) and WikiText-2's training text (LM) from ../shared/data, each
written k times over (k = --sizes) into a scratch folder. For each k: `attnkit prepare` / `attnkit lm prepare`, then
`attnkit train` / `attnkit lm train` for --steps updates (the multi30k and lm-word-wt2 presets, no evaluation
before the end). Each command runs alone, its memory read from /proc every 20 ms: the peak resident set (RSS), and
the peak of its anonymous part (RssAnon: the process's own memory; the rest is file pages, such as a memory-mapped
corpus's pages read so far, which the kernel drops under pressure). `--tree DIR` runs the commands of another
checkout (DIR/src on the path), e.g. the revision before the memory-mapped corpora, for a before/after table.
Writes OUT/corpus-memory.md and .json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FIELDS = ("VmRSS", "RssAnon")


def _status(pid: int) -> dict[str, int]:
    """The fields of /proc/PID/status in bytes (empty once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines) if k in FIELDS}


def measure(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run argv; its wall time and the peaks of FIELDS (MiB), polled every 20 ms."""
    start, peaks = time.perf_counter(), dict.fromkeys(FIELDS, 0)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        for k, v in _status(proc.pid).items():
            peaks[k] = max(peaks[k], v)
        time.sleep(0.02)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr.read()[-2000:]}")
    return {"seconds": time.perf_counter() - start, **{k: v / 2**20 for k, v in peaks.items()}}


def repeat(src: Path, dst: Path, k: int) -> int:
    """dst = src's text k times over (plain text); its size in bytes."""
    text = gzip.decompress(src.read_bytes())
    with open(dst, "wb") as f:
        for _ in range(k):
            f.write(text)
    return dst.stat().st_size


def run_size(k: int, scratch: Path, steps: int, env: dict[str, str]) -> list[dict]:
    attnkit = [sys.executable, "-m", "attnkit"]
    m30k, wt2, rows = SHARED / "multi30k", SHARED / "wikitext-2", []
    size = sum(repeat(m30k / f"train.{lang}.gz", scratch / f"train.{lang}", k) for lang in ("de", "en"))
    prepare = [*attnkit, "prepare", "--src", "de", "--tgt", "en", "--train", str(scratch / "train"),
               "--valid", str(m30k / "val"), "--out", str(scratch / "mt"), "--force"]
    train = [*attnkit, "train", "--data", str(scratch / "mt"), "--out", str(scratch / "mt-run"), "--force",
             "--config", "multi30k", f"--train.max_steps={steps}", "--train.max_minutes=0", "--train.eval_bleu=false",
             "--train.best_metric=loss", "--quiet"]
    rows += [{"corpus": "multi30k", "k": k, "bytes": size, "command": "prepare", **measure(prepare, env)},
             {"corpus": "multi30k", "k": k, "bytes": size, "command": "train", **measure(train, env)}]
    size = repeat(wt2 / "wiki.train.tokens.gz", scratch / "wt2.txt", k)
    prepare = [*attnkit, "lm", "prepare", "--train", str(scratch / "wt2.txt"), "--valid",
               str(wt2 / "wiki.valid.tokens.gz"), "--level", "word", "--out", str(scratch / "lm"), "--force"]
    train = [*attnkit, "lm", "train", "--data", str(scratch / "lm"), "--out", str(scratch / "lm-run"), "--force",
             "--config", "lm-word-wt2", f"--train.max_steps={steps}", "--train.max_minutes=0",
             "--train.horizon=steps", "--train.eval_max_tokens=2048", "--quiet"]
    rows += [{"corpus": "wikitext-2", "k": k, "bytes": size, "command": "lm prepare", **measure(prepare, env)},
             {"corpus": "wikitext-2", "k": k, "bytes": size, "command": "lm train", **measure(train, env)}]
    return rows


def table(rows: list[dict]) -> str:
    out = ["| corpus | copies | text (MB) | command | wall (s) | peak RSS (MiB) | peak anonymous (MiB) |",
           "|---|---:|---:|---|---:|---:|---:|"]
    out += [f"| {r['corpus']} | {r['k']} | {r['bytes'] / 1e6:,.0f} | `{r['command']}` | {r['seconds']:,.0f} | "
            f"{r['VmRSS']:,.0f} | {r['RssAnon']:,.0f} |" for r in rows]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--scratch", type=Path, default=Path("runs/corpus-memory"))
    ap.add_argument("--tree", type=Path, help="checkout whose src/ to run (default: this one)")
    ap.add_argument("--label", default="", help="name of the results' files: corpus-memory[-LABEL].md")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.tree:
        env["PYTHONPATH"] = str(args.tree.resolve() / "src")
    args.scratch.mkdir(parents=True, exist_ok=True)
    rows = []
    for k in args.sizes:
        rows += run_size(k, args.scratch, args.steps, env)
        print(table(rows), flush=True)
    name = "corpus-memory" + (f"-{args.label}" if args.label else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    (args.out / f"{name}.md").write_text(f"`python benchmarks/corpus_memory.py {' '.join(sys.argv[1:])}`\n\n"
                                         + table(rows), encoding="utf-8")


if __name__ == "__main__":
    main()
