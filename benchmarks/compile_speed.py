"""Does `torch.compile` pay for itself in a recipe's budget? Each recipe of benchmarks/train_profile.py trained on its
real data and batches for the same updates with `train.compile` off and on: docs/speed.md's compile table.

    python benchmarks/compile_speed.py --out runs/compile [--recipes multi30k ...] [--steps 40]
        [--set train.device=cuda ...]

Per recipe and setting: every update's wall time; the first `--warmup` updates hold the compilations (the first
shape, then the dynamic graph for the shapes after it), the next `--steps` are the steady state. Reported: the
steady tokens/s of each, the speed-up, the compile time (the warm-up's wall time beyond what the same updates take in
the steady state) and the break-even: the updates after which the compiled run has caught up (compile time ÷ the
time a compiled update saves), to set beside the recipe's budget in updates; where compiling fails, the error's first
line. Writes OUT/compile.md and .json; benchmarks/results/speed/compile.md keeps the table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from train_profile import RECIPES, each_recipe, recipe_arguments, recipe_trainer, write_results


def timed_updates(recipe: str, scratch: Path, updates: int, compile_: bool, overrides: list[str]
                  ) -> tuple[list[float], list[int], str]:
    """Every update's wall time (s) and tokens, `updates` of them (an update ends with its loss read: on a GPU,
    after its kernels ran), and the precision trained in."""
    trainer = recipe_trainer(recipe, scratch, updates, *overrides, f"train.compile={str(compile_).lower()}")
    step, walls, tokens = trainer.train_step, [], []

    def timed_step(*args):
        start = time.perf_counter()
        stats = step(*args)
        walls.append(time.perf_counter() - start)
        tokens.append(stats.get("tokens", 0))
        return stats

    trainer.train_step = timed_step
    trainer.fit()
    return walls[:updates], tokens[:updates], trainer.cfg.train.dtype


def measure(recipe: str, scratch: Path, warmup: int, steps: int, overrides: list[str]) -> dict:
    row: dict = {"recipe": recipe, "preset": RECIPES[recipe][1], "warmup": warmup, "steps": steps,
                 "overrides": overrides}
    for name, compile_ in (("eager", False), ("compiled", True)):
        try:  # the compiled run in the precision the eager one trained in (a preset's `auto` chose it there)
            walls, tokens, dtype = timed_updates(recipe, scratch, warmup + steps, compile_, overrides)
            overrides = [*overrides, f"train.dtype={dtype}"]
        except Exception as e:  # noqa: BLE001 - a compiler failure is a result of this benchmark
            row[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            print(f"{recipe} {name}: failed: {row[name]['error']}", file=sys.stderr, flush=True)
            return row
        steady = sum(walls[warmup:]) / steps  # s per update
        row[name] = {"tok_s": sum(tokens[warmup:]) / sum(walls[warmup:]), "step_ms": 1e3 * steady, "dtype": dtype,
                     "warmup_s": sum(walls[:warmup]), "walls": walls}
        print(f"{recipe} {name}: {row[name]['tok_s']:,.0f} tok/s, warm-up {row[name]['warmup_s']:.1f} s",
              file=sys.stderr, flush=True)
    eager, compiled = row["eager"], row["compiled"]
    row["speedup"] = compiled["tok_s"] / eager["tok_s"]
    row["compile_s"] = compiled["warmup_s"] - warmup * compiled["step_ms"] / 1e3
    saved = (eager["step_ms"] - compiled["step_ms"]) / 1e3  # s per update
    row["break_even"] = row["compile_s"] / saved if saved > 0 else None
    return row


def table(rows: list[dict]) -> str:
    out = ["| recipe | eager tok/s | compiled tok/s | speed-up | compile time (s) | break-even (updates) |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r["compiled"]:
            out.append(f"| `{r['preset']}` | {r['eager']['tok_s']:,.0f} | fails: {r['compiled']['error']} | | | |")
            continue
        even = f"{r['break_even']:,.0f}" if r["break_even"] is not None else "never"
        out.append(f"| `{r['preset']}` | {r['eager']['tok_s']:,.0f} | {r['compiled']['tok_s']:,.0f} | "
                   f"{r['speedup']:.2f}× | {r['compile_s']:.0f} | {even} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    recipe_arguments(ap)
    ap.add_argument("--warmup", type=int, default=10, help="updates that hold the compilations")
    ap.add_argument("--steps", type=int, default=40, help="steady updates timed after them")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides for every recipe and setting (train.device=cuda: on a GPU)")
    args = ap.parse_args()
    rows = each_recipe(args.recipes, "compile", lambda r: measure(r, args.scratch, args.warmup, args.steps, args.set))
    write_results(args.out, "compile", rows, table(rows))


if __name__ == "__main__":
    main()
