"""Where a training step's time goes, by category, for each recipe on its real batches: docs/speed.md's profile.

    python benchmarks/train_profile.py --out runs/profile [--recipes demo multi30k ...] [--steps 20]

Each recipe trains on its own corpus (prepared into --scratch when missing, from ../shared/data, as docs/results.md
prepares it; the demo's from its generated number corpus) with its preset's batches, precision and optimizer:
--warmup updates, then --steps updates under torch.profiler (CPU). Every operator's own time goes to the first
category that its name, or the name of the nearest enclosing range, matches (CATEGORIES, in order); the loss's and
the optimizer's ranges are named by the code (the loss's autograd functions, `_SoftmaxCrossEntropy` and
`_ProjectedCrossEntropy`, by their class names; torch names `Optimizer.step`);
backward operators sit under autograd's node of the forward operator (e.g. `MmBackward0`). "Python and the rest" is
the wall time of the steps that no operator accounts for: the interpreter, the batches' assembly, the profiler's
own cost. Then a few updates under torch's FLOP counter (matrix products, attention and the LSTM's fused cells,
forward and backward) and as many plain ones as were profiled, timed: the step's rate in GFLOP/s beside the
machine's matmul peak in the recipe's precision (`attnkit bench`'s: the fastest of a 1024³, 2048³ and 4096³
product), measured in the same process. Each recipe runs in a process of its own, set up as `attnkit train` sets
up its own for that recipe (`as_attnkit_train`). Writes OUT/train-profile.md and .json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.flop_counter import FlopCounterMode

from attnkit import config as cfgmod
from attnkit.bench.measure import STEP_FLOPS, matmul_peak
from attnkit.bench.workloads import STANDARD
from attnkit.cpu import bound_kernel_caches, keep_freed_memory
from attnkit.demo import PRESETS as DEMO_PRESETS
from attnkit.train.lm_trainer import LMTrainer
from attnkit.train.trainer import Trainer

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# category: substrings of an operator's or range's name, checked from the operator outwards
CATEGORIES = {
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn", "mkldnn::",
                        "MmBackward", "AddmmBackward", "BmmBackward"),
    "attention (kernels, softmax over keys)": ("scaled_dot_product", "ScaledDotProduct", "aten::_softmax",
                                               "SoftmaxBackward"),
    "loss over the vocabulary": ("label_smoothed_nll", "CrossEntropy", "log_softmax", "LogSoftmax",
                                 "nll_loss", "NllLoss", "cross_entropy", "adaptive"),
    "optimizer and clipping": ("Optimizer.step", "Optimizer.zero_grad", "_fused_adam", "_foreach_",
                               "clip_grad", "aten::norm", "linalg_vector_norm"),
    "recurrent cells (LSTM)": ("lstm", "LSTM", "mkldnn_rnn", "MkldnnRnn", "rnn_tanh", "gru"),
    "embedding gradients": ("embedding_dense_backward", "EmbeddingBackward", "embedding_backward"),
    "LayerNorm": ("layer_norm", "LayerNorm"),
    "activations and dropout": ("threshold_backward", "clamp_min", "relu", "gelu", "silu", "random_", "bernoulli",
                                "dropout"),
    "masks": ("aten::eq", "aten::ne", "aten::lt", "aten::ge", "masked_fill", "aten::triu", "aten::tril",
              "logical_not", "aten::where"),
}
RECIPES = {  # name: (what it trains, as attnkit.cpu.KERNEL_CACHE names it; preset; data folder under --scratch)
    "demo": ("translation", DEMO_PRESETS["de"], "demo"),
    "multi30k": ("translation", "multi30k", "multi30k"),
    "tatoeba-zh-en": ("translation", "tatoeba-zh-en", "tatoeba-zh-en"),
    "lm-word-wt2": ("lm", "lm-word-wt2", "wt2"),
    "lm-char-small": ("lm", "lm-char-small", "shakespeare"),
    "lm-char-small-xl": ("lm", "lm-char-small-xl", "shakespeare"),
    "rnn-bahdanau": ("translation", "rnn-bahdanau", "multi30k"),
    "rnn-luong": ("translation", "rnn-luong", "multi30k"),
}
PREPARE = {
    "multi30k": ["prepare", "--src", "de", "--tgt", "en", "--train", f"{SHARED}/multi30k/train", "--valid",
                 f"{SHARED}/multi30k/val", "--vocab-size", "8000"],
    "tatoeba-zh-en": ["prepare", "--src", "zh", "--tgt", "en", "--train", f"{SHARED}/tatoeba-cmn-eng/train",
                      "--valid", f"{SHARED}/tatoeba-cmn-eng/dev", "--vocab-size", "8000", "--normalization",
                      "identity", "--character-coverage", "1.0"],
    "wt2": ["lm", "prepare", "--train", f"{SHARED}/wikitext-2/wiki.train.tokens.gz", "--valid",
            f"{SHARED}/wikitext-2/wiki.valid.tokens.gz", "--level", "word"],
    "shakespeare": ["lm", "prepare", "--train", f"{SHARED}/tiny_shakespeare/input.txt.gz", "--valid-fraction", "0.1",
                    "--level", "char"],
}


def prepared(name: str, scratch: Path) -> Path:
    """The recipe's data folder, prepared once."""
    out = scratch / name
    if not out.is_dir():
        if name == "demo":
            from attnkit.data import prepare, write_number_corpus

            files = write_number_corpus(scratch / "demo-corpus", n_train=24000, n_valid=1000, n_test=1000)
            prepare(out, files["train"], files["valid"], vocab_size=400)
        else:
            subprocess.run([sys.executable, "-m", "attnkit", *PREPARE[name], "--out", str(out)], check=True)
    return out


def category(event) -> str:
    """The first CATEGORIES entry the operator's name or an enclosing range's name matches."""
    node = event
    while node is not None:
        for name, marks in CATEGORIES.items():
            if any(mark in node.name for mark in marks):
                return name
        node = node.cpu_parent
    return "other operators"


def recipe_trainer(recipe: str, scratch: Path, updates: int, *overrides: str) -> Trainer | LMTrainer:
    """The recipe's trainer on its real data and batches for `updates` updates, evaluating as little as it can."""
    kind, preset, data = RECIPES[recipe]
    data_dir = prepared(data, scratch)
    budget = [f"train.max_steps={updates}", "train.max_minutes=0", "train.horizon=steps", *overrides]
    if kind == "translation":
        cfg = cfgmod.resolve([preset], [*budget, "train.eval_bleu=false", "train.best_metric=loss"])
        return Trainer(cfg, data_dir, scratch / "runs" / recipe, force=True, progress=False)
    cfg = cfgmod.resolve([preset], [*budget, "train.eval_max_tokens=1024", "train.eval_interval=100000"],
                         cls=cfgmod.LMRunConfig)
    return LMTrainer(cfg, data_dir, scratch / "runs" / recipe, force=True, progress=False)


def profile_recipe(recipe: str, scratch: Path, warmup: int, steps: int, counted: int = 3) -> dict:
    """`warmup` updates, `steps` under the profiler, `counted` under torch's FLOP counter, then `steps` plain ones
    timed: the category shares come from the profiled steps, the rate (GFLOP/s) from the plain ones."""
    trainer = recipe_trainer(recipe, scratch, warmup + 1 + 2 * steps + counted + 1)
    cfg, preset = trainer.cfg, RECIPES[recipe][1]
    step, walls, tokens, flops = trainer.train_step, [], [], []
    plain = warmup + 1 + steps + counted  # the first plain timed update
    plan = schedule(wait=warmup, warmup=1, active=steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
        def timed_step(*args):
            n = len(walls)
            start = time.perf_counter()
            if plain - counted <= n < plain:
                with FlopCounterMode(display=False, custom_mapping=STEP_FLOPS) as counter:
                    stats = step(*args)
                flops.append((counter.get_total_flops(), stats.get("tokens", 0)))
            else:
                stats = step(*args)
            if n < plain + steps:
                walls.append(time.perf_counter() - start)
                tokens.append(stats.get("tokens", 0))
            if n <= warmup + steps:
                prof.step()
            return stats

        trainer.train_step = timed_step
        trainer.fit()
    by_category: dict[str, float] = defaultdict(float)
    others: dict[str, float] = defaultdict(float)  # what "other operators" holds, for the notes
    for event in prof.events():
        if not event.name.startswith("ProfilerStep"):  # a step's own time is the Python around its operators
            name = category(event)
            by_category[name] += event.self_cpu_time_total / 1e6  # seconds
            if name == "other operators":
                others[event.name] += event.self_cpu_time_total / 1e6
    wall = sum(walls[warmup + 1 : warmup + 1 + steps])
    by_category["Python and the rest"] = max(0.0, wall - sum(by_category.values()))
    flop_per_token = sum(f for f, _ in flops) / sum(t for _, t in flops)
    tok_s = sum(tokens[plain:]) / sum(walls[plain:])
    peak = matmul_peak(STANDARD, cfg.train.dtype)["gflop_s"]  # `attnkit bench`'s peak: 1024³-4096³, the fastest
    return {"recipe": recipe, "preset": preset, "dtype": cfg.train.dtype, "steps": steps,
            "step_ms": 1e3 * wall / steps, "tokens_per_step": sum(tokens[warmup + 1 :]) / (len(tokens) - warmup - 1),
            "plain_tok_s": tok_s, "mflop_per_token": flop_per_token / 1e6, "gflop_s": flop_per_token * tok_s / 1e9,
            "peak_gflop_s": peak,
            "shares": {k: v / wall for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
            "other_operators": {k: v / wall for k, v in sorted(others.items(), key=lambda kv: -kv[1])[:8]}}


def table(rows: list[dict]) -> str:
    names = [*CATEGORIES, "other operators", "Python and the rest"]
    out = ["| recipe | precision | step (ms) | tokens a step | " + " | ".join(names) + " |",
           "|---|---|---:|---:|" + "---:|" * len(names)]
    for r in rows:
        shares = " | ".join(f"{100 * r['shares'].get(n, 0.0):.1f}%" for n in names)
        out.append(f"| `{r['preset']}` | {r['dtype']} | {r['step_ms']:,.0f} | {r['tokens_per_step']:,.0f} | {shares} |")
    out += ["", "| recipe | precision | tok/s (unprofiled) | MFLOP a token | GFLOP/s | matmul peak GFLOP/s "
            "| of the peak |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| `{r['preset']}` | {r['dtype']} | {r['plain_tok_s']:,.0f} | {r['mflop_per_token']:.1f} | "
                   f"{r['gflop_s']:.1f} | {r['peak_gflop_s']:.1f} | {100 * r['gflop_s'] / r['peak_gflop_s']:.0f}% |")
    return "\n".join(out) + "\n"


def as_attnkit_train(recipe: str) -> None:
    """This process set up as `attnkit train` sets up its own for `recipe`: 2 threads, glibc keeping freed memory for
    reuse and oneDNN's kernel caches kept small, at the size for its kind (`attnkit.cli.main.tune_process`); without
    them a step's fresh large tensors cost page faults the recipes never pay (the chunked loss's exp took 1.7 ms a
    chunk instead of 0.6)."""
    torch.set_num_threads(2)
    keep_freed_memory()
    bound_kernel_caches(RECIPES[recipe][0])


def each_recipe(recipes: list[str], name: str, measure_one: Callable[[str], dict]) -> list[dict]:
    """The rows of `recipes`: one is measured in this process; several each in a process of its own, this script
    run again for it alone (oneDNN reads its kernel cache's size once a process, and the translation and LM verbs
    size it differently), its row read back from the NAME.json it writes."""
    if len(recipes) == 1:
        as_attnkit_train(recipes[0])
        return [measure_one(recipes[0])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in recipes:  # argparse keeps an option's last occurrence: these two replace the command's own
            subprocess.run([sys.executable, sys.argv[0], *sys.argv[1:], "--out", tmp, "--recipes", recipe],
                           check=True, stdout=subprocess.DEVNULL)
            rows += json.loads((Path(tmp) / f"{name}.json").read_text(encoding="utf-8"))
    return rows


def recipe_arguments(ap: argparse.ArgumentParser) -> None:
    """The options every per-recipe benchmark takes: where to write, which recipes, where their data is prepared."""
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--scratch", type=Path, default=Path("runs/profile"))


def write_results(out: Path, name: str, rows: list[dict], markdown: str) -> None:
    """OUT/NAME.json (the rows) and OUT/NAME.md (the command that ran, then the table), the table printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    text = f"`python benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}`\n\n" + markdown
    (out / f"{name}.md").write_text(text, encoding="utf-8")
    print(text, end="")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    recipe_arguments(ap)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    rows = each_recipe(args.recipes, "train-profile",
                       lambda r: profile_recipe(r, args.scratch, args.warmup, args.steps))
    write_results(args.out, "train-profile", rows, table(rows))


if __name__ == "__main__":
    main()
