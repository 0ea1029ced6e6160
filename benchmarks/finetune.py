"""Fine-tuning measured: a Multi30k model taught German number words, by full fine-tuning, by LoRA adapters and,
for comparison, a model trained from scratch on the small data alone (docs/results.md, "Fine-tuning").

    python benchmarks/finetune.py --base runs/multi30k/checkpoints/best.safetensors \
        --data ../shared/data/multi30k --out runs/finetune

1. The new domain: 3,000 German->English pairs of number words (attnkit.data.demo_corpus, the demo's corpus; its dev
   and test numbers are disjoint from the training ones), encoded with the base model's own tokenizers
   (`attnkit prepare --tokenizer-from`).
2. Each system trains for the same number of updates (`--steps`) under the `finetune` preset; the learning rate of
   full fine-tuning and of LoRA (rank 8 on q, k, v, W^O and the FFN) is chosen among `--lrs` on dev, by the mean of
   the number words' dev BLEU and Multi30k's val BLEU (what is gained and what is kept count alike). The model from
   scratch is the demo's recipe (`demo` preset, its own subwords) for the same updates.
3. Every system, the base included, is scored with greedy search on both test sets: what is gained on the number words,
   what is forgotten of Multi30k; beside them the updates, the parameters trained and the training's wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.cli.main import main as attnkit
from attnkit.data import read_lines, write_number_corpus
from attnkit.decode import Translator
from attnkit.eval import translate_and_score
from attnkit.io import atomic_write_text


def run(*argv) -> None:
    if attnkit([str(a) for a in argv]) != 0:
        raise SystemExit(f"attnkit {' '.join(map(str, argv[:2]))} failed")


def bleu(checkpoint: Path, src: list[str], ref: list[str]) -> float:
    return translate_and_score(Translator.from_checkpoint(checkpoint, device="cpu"), src, ref)[1].bleu


def train(out: Path, data: Path, *overrides: str) -> dict:
    """One training run; its best checkpoint, updates, trained parameters and wall time."""
    start = time.perf_counter()
    run("train", "--data", data, "--out", out, "--quiet", *overrides)
    seconds = time.perf_counter() - start
    state = load_checkpoint(out / "checkpoints" / "last.safetensors", adapters=True)  # LoRA: the adapters apart
    adapters = [v.numel() for k, v in state.model_state.items() if ".lora_" in k]
    trained = sum(adapters) if adapters else sum(v.numel() for v in state.model_state.values())
    return {"ckpt": out / "checkpoints" / "best.safetensors", "updates": state.train_state["step"],
            "trained": trained, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the Multi30k model")
    ap.add_argument("--data", default="../shared/data/multi30k")
    ap.add_argument("--out", default="runs/finetune")
    ap.add_argument("--steps", type=int, default=300, help="updates of every system")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 1e-3], help="peak learning rates to choose from")
    ap.add_argument("--pairs", type=int, default=3000, help="training pairs of the new domain")
    args = ap.parse_args()
    torch.set_num_threads(2)
    out, m30k = Path(args.out), Path(args.data)
    corpus = write_number_corpus(out / "numbers", n_train=args.pairs, n_valid=300, n_test=300, seed=1)
    prefix = Path(corpus["train"][0]).with_suffix("")
    splits = ["--train", prefix, "--valid", prefix.parent / "valid", "--test", prefix.parent / "test"]
    run("prepare", "--src", "de", "--tgt", "en", *splits, "--tokenizer-from", args.base, "--out", out / "ft-data")
    run("prepare", "--src", "de", "--tgt", "en", *splits, "--vocab-size", "1000", "--out", out / "scratch-data")
    sets = {"numbers val": corpus["valid"], "numbers test": corpus["test"],
            "Multi30k val": (m30k / "val.de.gz", m30k / "val.en.gz"),
            "Multi30k test": (m30k / "test_2016_flickr.de.gz", m30k / "test_2016_flickr.en.gz")}
    text = {name: (read_lines(s), read_lines(t)) for name, (s, t) in sets.items()}

    def scores(ckpt: Path, names) -> dict[str, float]:
        return {name: bleu(ckpt, *text[name]) for name in names}

    fixed = ["--train.max_steps", args.steps, "--train.max_epochs", 1000]
    systems = {"base model (no training)": {"ckpt": Path(args.base), "updates": 0, "trained": 0, "seconds": 0.0}}
    for name, extra in (("full fine-tuning", []), ("LoRA r=8", ["--train.lora_r=8"])):
        tried = {}
        for lr in args.lrs:
            r = train(out / f"{name.split()[0].lower()}-lr{lr:g}", out / "ft-data", "--init-from", args.base,
                      *fixed, f"--train.lr={lr}", *extra)
            r["dev"] = scores(r["ckpt"], ["numbers val", "Multi30k val"])
            r["lr"] = lr
            tried[lr] = r
        systems[name] = max(tried.values(), key=lambda r: sum(r["dev"].values()))
        systems[name]["tried"] = {lr: r["dev"] for lr, r in tried.items()}
    systems["from scratch on the number words"] = train(out / "scratch", out / "scratch-data", "--config", "demo",
                                                        *fixed)
    rows = []
    for name, r in systems.items():
        # the model from scratch has the number words' subwords only: Multi30k is not its task
        got = scores(r["ckpt"], ["numbers test"] if "scratch" in name else ["numbers test", "Multi30k test"])
        rows.append({"system": name, **{k: v for k, v in r.items() if k != "ckpt"}, "test": got})
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    atomic_write_text(out / "results.md", table(rows, args))
    print((out / "results.md").read_text(encoding="utf-8"))


def table(rows: list[dict], args) -> str:
    lines = [f"`python benchmarks/finetune.py --base {args.base} --data {args.data} --out {args.out} --steps "
             f"{args.steps}`", "",
             "| system | lr (chosen on dev) | updates | parameters trained | training wall time | numbers test BLEU | "
             "Multi30k test BLEU |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        m30k = r["test"].get("Multi30k test")
        lines.append(f"| {r['system']} | {r.get('lr', '')} | {r['updates']:,} | {r['trained']:,} | "
                     f"{r['seconds'] / 60:.1f} min | {r['test']['numbers test']:.2f} | "
                     f"{'' if m30k is None else f'{m30k:.2f}'} |")
    lines += ["", "dev BLEU of each learning rate tried (numbers val / Multi30k val):"]
    for r in rows:
        for lr, dev in r.get("tried", {}).items():
            lines.append(f"- {r['system']}, lr {lr:g}: {dev['numbers val']:.2f} / {dev['Multi30k val']:.2f}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
