"""Experiments that compare model families on one corpus, each writing a table and a plot into a folder.

- `compare_models`: train each preset on the same prepared data under the same wall-clock budget, then
  report parameters, training time, dev/test BLEU and perplexity (`compare.csv`, `compare.md`, `compare.png`).
- `bleu_by_length`: corpus BLEU per source-length bucket for several checkpoints, one line per model
  (`by_length.csv`, `by_length.md`, `by_length.png`): the fixed-vector encoder-decoder degrades as
  sentences grow, attention does not (Bahdanau et al. 2015, figure 2).

Source length is counted in whitespace-separated words of the raw source, as in the papers, or in
subword pieces (for compounding languages, or corpora of one-word sentences).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit import config as cfgmod
from attnkit.data import TokenBatchSampler, iterate_batches, load_split, read_lines
from attnkit.decode import DecodeOptions, Translator, score_targets
from attnkit.errors import AttnkitError
from attnkit.eval.bleu import score_corpus
from attnkit.io import atomic_open, atomic_write_bytes, atomic_write_text

SPLITS = {"dev": "valid", "test": "test"}  # table prefix -> split name in a prepared data folder


# --- tables and pictures ------------------------------------------------------------------------
def _cell(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(out_dir: Path, stem: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    """`stem`.csv (full precision) and `stem`.md (two decimals) in `out_dir`."""
    with atomic_open(out_dir / f"{stem}.csv", "w") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    atomic_write_text(out_dir / f"{stem}.md", markdown_table(header, rows))


def _save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    return plt


# --- compare ------------------------------------------------------------------------------------
@dataclass
class ModelResult:
    name: str
    kind: str
    parameters: int
    train_minutes: float
    steps: int
    dev_bleu: float = float("nan")
    dev_bleu_lc: float = float("nan")
    dev_ppl: float = float("nan")
    test_bleu: float = float("nan")
    test_bleu_lc: float = float("nan")
    test_ppl: float = float("nan")
    checkpoint: str = ""


@torch.no_grad()
def split_perplexity(model: torch.nn.Module, data_dir: str | Path, split: str, *, max_tokens: int = 4096,
                     device: torch.device | str = "cpu") -> float:
    """exp(mean NLL per target token, EOS included) of a prepared split under teacher forcing."""
    data = load_split(data_dir, split)
    sampler = TokenBatchSampler(data.src_lens, data.tgt_lens, max_tokens, shuffle=False)
    model.eval()
    logp = tokens = 0.0
    for batch in iterate_batches(data, sampler.batches(0)):
        batch = batch.to(device)
        logp += float(score_targets(model, batch.src, batch.tgt_in, batch.tgt_out).sum())
        tokens += batch.n_tokens
    return math.exp(min(-logp / max(tokens, 1), 50.0))


def evaluate_checkpoint(path: Path, data_dir: Path, options: DecodeOptions, device: str = "auto") -> dict:
    """Parameters, and BLEU (cased, lowercased) and perplexity on the prepared dev and test splits that exist."""
    translator = Translator.from_checkpoint(path, device=device)
    out: dict[str, float] = {"parameters": sum(p.numel() for p in translator.model.parameters())}
    for prefix, split in SPLITS.items():
        if not (data_dir / f"{split}.src.txt").exists():
            continue
        hyps = translator.translate_texts(read_lines(data_dir / f"{split}.src.txt"), options=options)
        scores = score_corpus(hyps, read_lines(data_dir / f"{split}.tgt.txt"))
        out[f"{prefix}_bleu"], out[f"{prefix}_bleu_lc"] = scores.bleu, scores.bleu_lc
        out[f"{prefix}_ppl"] = split_perplexity(translator.model, data_dir, split, device=translator.device)
    return out


def _train_one(preset: str, overrides: list[str], data_dir: Path, run_dir: Path, *, force: bool, reuse: bool,
               progress: bool, say: Callable[[str], None]) -> None:
    from attnkit.train.trainer import Trainer

    last = run_dir / "checkpoints" / "last.safetensors"
    if last.exists() and reuse:
        say(f"{run_dir}: already trained, evaluating it as it is")
        return
    if last.exists() and not force:
        raise AttnkitError(f"{run_dir} already holds a run; pass --force to retrain it or --reuse to evaluate it")
    cfg = cfgmod.resolve([preset], overrides)
    say(f"training {preset} ({cfg.model.kind}, budget {cfg.train.max_minutes or 'none'} min) in {run_dir}")
    Trainer(cfg, data_dir, run_dir, force=True, progress=progress).fit()


def compare_models(presets: Sequence[str], data_dir: str | Path, out_dir: str | Path, *,
                   overrides: Sequence[str] = (), minutes: float | None = None, options: DecodeOptions | None = None,
                   force: bool = False, reuse: bool = False, progress: bool = True,
                   say: Callable[[str], None] = print) -> list[ModelResult]:
    """Train every preset (or config file) on `data_dir` under the same budget, evaluate, tabulate, plot.

    `minutes` sets train.max_minutes for every model (the same wall-clock budget); `overrides` apply to
    every model. Each run lives in OUT/<preset name>; the best checkpoint (by the preset's metric) is
    evaluated, or the last one when there is no dev set.
    """
    from attnkit.train.checkpoint import load_checkpoint

    data_dir, out_dir = Path(data_dir), Path(out_dir)
    names = [Path(p).stem for p in presets]
    if len(set(names)) != len(names):
        raise AttnkitError(f"experiment compare: model names repeat ({', '.join(names)}); each needs its own folder")
    budget = [f"train.max_minutes={minutes}"] if minutes is not None else []
    results = []
    for preset, name in zip(presets, names):
        run_dir = out_dir / name
        _train_one(preset, list(overrides) + budget, data_dir, run_dir, force=force, reuse=reuse, progress=progress,
                   say=say)
        best, last = run_dir / "checkpoints" / "best.safetensors", run_dir / "checkpoints" / "last.safetensors"
        ckpt = load_checkpoint(last)  # the training position: time and updates spent
        chosen = best if best.exists() else last
        metrics = evaluate_checkpoint(chosen, data_dir, options or DecodeOptions(), ckpt.config.train.device)
        results.append(ModelResult(name=name, kind=ckpt.kind, train_minutes=ckpt.train_state.get("elapsed_s", 0.0) / 60,
                                   steps=ckpt.train_state.get("step", 0), checkpoint=str(chosen), **metrics))
        say(f"{name}: " + ", ".join(f"{k} {_cell(v)}" for k, v in metrics.items()))
    write_compare(results, out_dir)
    return results


def write_compare(results: Sequence[ModelResult], out_dir: Path) -> None:
    header = [f for f in asdict(results[0]) if f != "checkpoint"]
    write_table(out_dir, "compare", header, [[getattr(r, f) for f in header] for r in results])
    plot_compare(results, out_dir / "compare.png")


def plot_compare(results: Sequence[ModelResult], path: Path) -> None:
    """Grouped bars: dev and test BLEU per model, with the parameter count under each name."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(results) + 1.5), 3.6))
    x = np.arange(len(results))
    for offset, (label, key) in zip((-0.2, 0.2), (("dev", "dev_bleu"), ("test", "test_bleu"))):
        values = [0.0 if math.isnan(getattr(r, key)) else getattr(r, key) for r in results]
        bars = ax.bar(x + offset, values, width=0.4, label=f"{label} BLEU")
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(x, [f"{r.name}\n{r.parameters / 1e6:.1f}M params, {r.train_minutes:.1f} min" for r in results],
                  fontsize=8)
    ax.set_ylabel("sacreBLEU")
    ax.set_title("same data, same wall-clock budget")
    ax.legend(fontsize=8)
    _save_figure(fig, path)


# --- BLEU by source length ----------------------------------------------------------------------
def length_buckets(lengths: Sequence[int], n_buckets: int = 5, edges: Sequence[int] | None = None
                   ) -> list[tuple[int, int]]:
    """Inclusive (shortest, longest) source-length ranges covering `lengths`.

    With `edges` the buckets end at those lengths (10, 20 -> up to 10, 11-20, 21 and more); without,
    at quantiles, so that each bucket holds about as many sentences (ties keep a length in one bucket).
    """
    if not len(lengths):
        raise AttnkitError("by-length: no sentences to bucket")
    if n_buckets < 1:
        raise AttnkitError(f"by-length: --buckets must be at least 1, not {n_buckets}")
    lo, hi = int(min(lengths)), int(max(lengths))
    if edges is None:
        qs = np.quantile(np.asarray(lengths), np.linspace(0, 1, n_buckets + 1)[1:-1], method="lower")
        edges = [int(q) for q in qs]
    bounds, start = [], lo
    for edge in sorted(set(int(e) for e in edges)):
        if start <= edge < hi:
            bounds.append((start, edge))
            start = edge + 1
    return bounds + [(start, hi)]


def bucket_label(bucket: tuple[int, int]) -> str:
    return str(bucket[0]) if bucket[0] == bucket[1] else f"{bucket[0]}-{bucket[1]}"


def bucket_scores(lengths: Sequence[int], hyps: Sequence[str], refs: Sequence[str],
                  buckets: Sequence[tuple[int, int]]) -> list[dict]:
    """Corpus BLEU of the sentences in each bucket: [{"bucket", "sentences", "bleu", "bleu_lc"}]."""
    out = []
    for bucket in buckets:
        idx = [i for i, n in enumerate(lengths) if bucket[0] <= n <= bucket[1]]
        if not idx:
            out.append({"bucket": bucket, "sentences": 0, "bleu": float("nan"), "bleu_lc": float("nan")})
            continue
        s = score_corpus([hyps[i] for i in idx], [refs[i] for i in idx])
        out.append({"bucket": bucket, "sentences": len(idx), "bleu": s.bleu, "bleu_lc": s.bleu_lc})
    return out


def checkpoint_label(path: str | Path) -> str:
    """RUN/checkpoints/best.safetensors -> RUN's folder name; other files -> their stem."""
    path = Path(path)
    return path.parent.parent.name if path.parent.name == "checkpoints" else path.stem


def bleu_by_length(checkpoints: dict[str, str | Path], sources: list[str], refs: list[str], out_dir: str | Path,
                   *, options: DecodeOptions | None = None, n_buckets: int = 5, edges: Sequence[int] | None = None,
                   unit: str = "words", metric: str = "bleu", device: str = "auto",
                   say: Callable[[str], None] = print) -> dict[str, list[dict]]:
    """Translate `sources` with each checkpoint (label -> path); BLEU per source-length bucket, table + chart.

    unit: "words" (whitespace-separated) or "pieces" (subwords of the first checkpoint's tokenizer).
    """
    if len(sources) != len(refs):
        raise AttnkitError(f"by-length: {len(sources)} sources but {len(refs)} references (not line-aligned)")
    translators = {label: Translator.from_checkpoint(path, device=device) for label, path in checkpoints.items()}
    if unit == "pieces":
        lengths = [len(ids) for ids in next(iter(translators.values())).src_tok.encode(sources)]
    else:
        lengths = [len(s.split()) for s in sources]
    buckets = length_buckets(lengths, n_buckets, edges)
    results = {}
    for label, translator in translators.items():
        say(f"translating {len(sources)} sentences with {label} ({checkpoints[label]})")
        results[label] = bucket_scores(lengths, translator.translate_texts(sources, options=options), refs, buckets)
    first = next(iter(results.values()))
    header = [f"source {unit}", "sentences"] + [f"{label} {m}" for label in results for m in ("bleu", "bleu_lc")]
    rows = [[bucket_label(b["bucket"]), b["sentences"]]
            + [results[label][i][m] for label in results for m in ("bleu", "bleu_lc")]
            for i, b in enumerate(first)]
    out_dir = Path(out_dir)
    write_table(out_dir, "by_length", header, rows)
    plot_by_length(results, out_dir / "by_length.png", metric, unit)
    return results


def plot_by_length(results: dict[str, list[dict]], path: Path, metric: str = "bleu", unit: str = "words") -> None:
    """One line per model: BLEU against the source-length bucket."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    first = next(iter(results.values()))
    x = np.arange(len(first))
    for label, scores in results.items():
        ax.plot(x, [s[metric] for s in scores], marker="o", label=label)
    ax.set_xticks(x, [f"{bucket_label(s['bucket'])}\n({s['sentences']})" for s in first], fontsize=8)
    ax.set_xlabel(f"source length in {unit} (sentences)")
    ax.set_ylabel("sacreBLEU" + (" (lowercased)" if metric == "bleu_lc" else ""))
    ax.set_title("BLEU by source length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save_figure(fig, path)


__all__ = ["ModelResult", "bleu_by_length", "bucket_scores", "compare_models", "evaluate_checkpoint",
           "length_buckets", "markdown_table", "split_perplexity", "write_table"]
