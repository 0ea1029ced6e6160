"""`attnkit experiment compare`: train several model families on one corpus and budget, then tabulate them.

For each preset: parameters, training time, dev/test BLEU and perplexity (`compare.csv`, `compare.md`,
`compare.png`), every model trained on the same prepared data under the same wall-clock budget.

A run folder that holds a model is trained again only with --force; --reuse evaluates it only where it was trained
with the same resolved config and data (`attnkit.experiments.runs`), so a rerun never mixes runs of other settings.

`attnkit experiment heads` runs the same machinery over one preset with 1, 2, 4, 8 heads at equal d_model
(d_k = d_v = d_model / h, so the parameters stay: Vaswani et al. 2017, table 3, rows A) and writes `heads.*`.
`attnkit experiment parts` runs it over one preset with one part of the paper's model taken away in each row
(`PARTS`: the residual connections, the FFN, W^O, separate keys, the 1 / sqrt(d_k) scale, the positions) and
writes `parts.*`; `attnkit experiment ancestors` over the fixed vector, the RNN attentions and the Transformer
(`ANCESTORS`) and writes `ancestors.*`. Both give every row the same number of updates with `updates`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit import config as cfgmod
from attnkit.cpu import for_inference
from attnkit.data import TokenBatchSampler, iterate_batches, load_split, read_lines
from attnkit.data.dataset import data_languages
from attnkit.decode import DecodeOptions, Translator, score_targets
from attnkit.errors import AttnkitError, ConfigError
from attnkit.eval import translate_and_score
from attnkit.experiments.rows import ANCESTORS, PARTS
from attnkit.experiments.runs import clear_run, record_run, refuse_other_run, run_identity
from attnkit.experiments.tables import cell, write_table
from attnkit.viz.figure import finish, subplots

SPLITS = {"dev": "valid", "test": "test"}  # table prefix -> split name in a prepared data folder


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
    dev_chrf: float = float("nan")
    dev_ppl: float = float("nan")
    test_bleu: float = float("nan")
    test_bleu_lc: float = float("nan")
    test_chrf: float = float("nan")
    test_ppl: float = float("nan")
    bleu_tokenizer: str = ""  # sacreBLEU's tokeniser, chosen for the target language
    checkpoint: str = ""


@torch.no_grad()
def split_perplexity(model: torch.nn.Module, data_dir: str | Path, split: str, *, max_tokens: int = 4096,
                     device: torch.device | str = "cpu") -> float:
    """exp(mean NLL per target token, EOS included) of a prepared split under teacher forcing."""
    data = load_split(data_dir, split)
    sampler = TokenBatchSampler(data.src_lens, data.tgt_lens, max_tokens, shuffle=False)
    model = for_inference(model.eval())
    logp = tokens = 0.0
    for batch in iterate_batches(data, sampler.batches(0)):
        batch = batch.to(device)
        logp += float(score_targets(model, batch.src, batch.tgt_in, batch.tgt_out).sum())
        tokens += batch.n_tokens
    return math.exp(min(-logp / max(tokens, 1), 50.0))


def evaluate_checkpoint(path: Path, data_dir: Path, options: DecodeOptions, device: str = "auto") -> dict:
    """Parameters, and BLEU (cased, lowercased; tokenised for the target language prepare recorded, else the
    references' script), chrF and perplexity on the prepared dev and test splits that exist."""
    translator = Translator.from_checkpoint(path, device=device)
    out: dict[str, float | str] = {"parameters": sum(p.numel() for p in translator.model.parameters())}
    lang = data_languages(data_dir)["tgt"]
    for prefix, split in SPLITS.items():
        if not (data_dir / f"{split}.src.txt").exists():
            continue
        _, scores = translate_and_score(translator, read_lines(data_dir / f"{split}.src.txt"),
                                        read_lines(data_dir / f"{split}.tgt.txt"), options, lang=lang)
        out[f"{prefix}_bleu"], out[f"{prefix}_bleu_lc"] = scores.bleu, scores.bleu_lc
        out[f"{prefix}_chrf"], out["bleu_tokenizer"] = scores.chrf, scores.tokenizer.name
        out[f"{prefix}_ppl"] = split_perplexity(translator.model, data_dir, split, device=translator.device)
    return out


def _check_run(preset: str, overrides: list[str], data_dir: Path, run_dir: Path, *, force: bool, reuse: bool
               ) -> tuple[cfgmod.RunConfig, dict, bool]:
    """(config, identity, whether to train) of one model, refusing a run in `run_dir` that neither `force` (train
    anew) nor `reuse` (evaluate it, when it has these settings and data: `attnkit.experiments.runs`) allows."""
    try:
        cfg = cfgmod.resolve([preset], overrides)
    except ConfigError as e:  # shared overrides reach every model: say which one they do not fit
        raise ConfigError(f"{run_dir.name} ({preset}): {e}") from e
    identity = run_identity(cfg, data_dir)
    last = run_dir / "checkpoints" / "last.safetensors"
    if last.exists() and reuse and not force:
        refuse_other_run(run_dir, identity, "pass --force to train it again with this run's settings")
        return cfg, identity, False
    if last.exists() and not force:
        raise AttnkitError(f"{run_dir} already holds a run; pass --force to retrain it or --reuse to evaluate it")
    return cfg, identity, True


def _train_one(preset: str, cfg: cfgmod.RunConfig, identity: dict, data_dir: Path, run_dir: Path, *,
               progress: bool, say: Callable[[str], None]) -> None:
    """Train from an empty run folder: a best or epoch checkpoint another run left must not be scored for this one."""
    from attnkit.train.trainer import Trainer

    clear_run(run_dir)
    record_run(run_dir, identity)
    say(f"training {preset} ({cfg.model.kind}, budget {cfg.train.max_minutes or 'none'} min) in {run_dir}")
    Trainer(cfg, data_dir, run_dir, force=True, progress=progress).fit()


@dataclass(frozen=True)
class ModelSpec:
    """One model of a comparison: its name (run folder and table row), preset and the overrides of its own."""

    name: str
    preset: str
    overrides: tuple[str, ...] = ()


def compare_models(presets: Sequence[str], data_dir: str | Path, out_dir: str | Path, *,
                   overrides: Sequence[str] = (), minutes: float | None = None, options: DecodeOptions | None = None,
                   force: bool = False, reuse: bool = False, progress: bool = True,
                   say: Callable[[str], None] = print) -> list[ModelResult]:
    """Train every preset (or config file) on `data_dir` under the same budget, evaluate, tabulate, plot.

    `minutes` sets train.max_minutes for every model (the same wall-clock budget); `overrides` apply to
    every model. Each run lives in OUT/<preset name>; the best checkpoint (by the preset's metric) is
    evaluated, or the last one when there is no dev set.
    """
    specs = [ModelSpec(Path(p).stem, p) for p in presets]
    results = compare_specs(specs, data_dir, out_dir, overrides=overrides, minutes=minutes, options=options,
                            force=force, reuse=reuse, progress=progress, say=say)
    write_compare(results, Path(out_dir))
    return results


def compare_heads(preset: str, heads: Sequence[int], data_dir: str | Path, out_dir: str | Path, **kw
                  ) -> list[ModelResult]:
    """`preset` with each number of heads at its d_model (OUT/heads-<h>), as `compare_models` trains and scores
    them (same keywords); writes heads.{csv,md,png} with the head dimension d_model / h beside each row."""
    d_model = cfgmod.resolve([preset], list(kw.get("overrides", ()))).model.d_model
    bad = [h for h in heads if h < 1 or d_model % h]
    if bad or len(set(heads)) != len(heads):
        raise AttnkitError(f"experiment heads: {', '.join(map(str, heads))} heads: each must divide d_model "
                           f"{d_model} once")
    specs = [ModelSpec(f"heads-{h}", preset, (f"model.n_heads={h}",)) for h in heads]
    results = compare_specs(specs, data_dir, out_dir, **kw)
    _tabulate(results, Path(out_dir), "heads", ["heads", "head dim"], [[h, d_model // h] for h in heads],
              f"{preset}: heads at d_model {d_model}, same budget")
    return results


def compare_parts(preset: str, parts: Sequence[str], data_dir: str | Path, out_dir: str | Path, *,
                  updates: int | None = None, **kw) -> list[ModelResult]:
    """`preset` with one part of the paper's model taken away per row (OUT/<part>, `PARTS`), trained and scored as
    `compare_models` does (same keywords); `updates` gives every row the same number of updates and no time limit.
    Writes parts.{csv,md,png}."""
    budget = _rows_budget("parts", parts, PARTS, updates, kw.get("minutes"))
    specs = [ModelSpec(part, preset, (*PARTS[part][1], *budget)) for part in parts]
    results = compare_specs(specs, data_dir, out_dir, **kw)
    _tabulate(results, Path(out_dir), "parts", ["part", "what changes"], [[p, PARTS[p][0]] for p in parts],
              f"{preset}: one part taken away per row, " + ("same budget" if updates is None else f"{updates} updates"))
    return results


def compare_ancestors(rows: Sequence[str], data_dir: str | Path, out_dir: str | Path, *, updates: int | None = None,
                      **kw) -> list[ModelResult]:
    """The fixed-vector encoder-decoder, the RNN attentions and the Transformer (OUT/<row>, `ANCESTORS`: each row a
    preset and its overrides), trained and scored as `compare_models` does (same keywords); `updates` gives every row
    the same number of updates and no time limit. Writes ancestors.{csv,md,png}."""
    budget = _rows_budget("ancestors", rows, ANCESTORS, updates, kw.get("minutes"))
    specs = [ModelSpec(row, ANCESTORS[row][1], (*ANCESTORS[row][2], *budget)) for row in rows]
    results = compare_specs(specs, data_dir, out_dir, **kw)
    budget_name = "same budget" if updates is None else f"{updates} updates"
    _tabulate(results, Path(out_dir), "ancestors", ["row", "model", "preset"],
              [[row, *ANCESTORS[row][:2]] for row in rows], f"from the fixed vector to the Transformer, {budget_name}")
    return results


def _rows_budget(experiment: str, rows: Sequence[str], known: dict, updates: int | None, minutes: float | None
                 ) -> tuple[str, ...]:
    """The overrides that give every row of a one-change-per-row table `updates` updates and no time limit (none
    without `updates`: each preset's budget), after refusing rows it does not know or names twice."""
    unknown = [row for row in rows if row not in known]
    if unknown or len(set(rows)) != len(rows) or not rows:
        raise AttnkitError(f"experiment {experiment}: {', '.join(rows) or 'no rows'}: name each of "
                           f"{', '.join(known)} at most once")
    if updates is not None and updates < 1:
        raise AttnkitError(f"experiment {experiment}: --updates {updates}: must be at least 1")
    if updates is not None and minutes is not None:
        raise AttnkitError(f"experiment {experiment}: --updates {updates} and --minutes {minutes}: give the one budget "
                           "every row shares, not both")
    return () if updates is None else (f"train.max_steps={updates}", "train.max_minutes=0")


def _tabulate(results: list[ModelResult], out_dir: Path, name: str, lead_header: list[str], lead: list[list],
              title: str) -> None:
    """NAME.{csv,md} with the `lead` columns before every result field, and NAME.png."""
    fields = [f for f in asdict(results[0]) if f not in ("checkpoint", "kind")]
    rows = [[*first, *(getattr(r, f) for f in fields)] for first, r in zip(lead, results)]
    write_table(out_dir, name, [*lead_header, *fields], rows)
    plot_compare(results, out_dir / f"{name}.png", title)


def compare_specs(specs: Sequence[ModelSpec], data_dir: str | Path, out_dir: str | Path, *,
                  overrides: Sequence[str] = (), minutes: float | None = None, options: DecodeOptions | None = None,
                  force: bool = False, reuse: bool = False, progress: bool = True,
                  say: Callable[[str], None] = print) -> list[ModelResult]:
    """Train and score every spec (see `compare_models`); the spec's own overrides come after the shared ones."""
    from attnkit.checkpoint import load_checkpoint

    data_dir, out_dir = Path(data_dir), Path(out_dir)
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise AttnkitError(f"experiment compare: model names repeat ({', '.join(names)}); each needs its own folder")
    budget = [f"train.max_minutes={minutes}"] if minutes is not None else []
    plans = [_check_run(spec.preset, [*overrides, *spec.overrides, *budget], data_dir, out_dir / spec.name,
                        force=force, reuse=reuse) for spec in specs]  # every model checked before any trains
    results = []
    for spec, (cfg, identity, train) in zip(specs, plans):
        name, run_dir = spec.name, out_dir / spec.name
        if train:
            _train_one(spec.preset, cfg, identity, data_dir, run_dir, progress=progress, say=say)
        else:
            say(f"{run_dir}: trained with these settings and data already, evaluating it as it is")
        best, last = run_dir / "checkpoints" / "best.safetensors", run_dir / "checkpoints" / "last.safetensors"
        ckpt = load_checkpoint(last)  # the training position: time and updates spent
        chosen = best if best.exists() else last
        metrics = evaluate_checkpoint(chosen, data_dir, options or DecodeOptions(), ckpt.config.train.device)
        results.append(ModelResult(name=name, kind=ckpt.kind, train_minutes=ckpt.train_state.get("elapsed_s", 0.0) / 60,
                                   steps=ckpt.train_state.get("step", 0), checkpoint=str(chosen), **metrics))
        say(f"{name}: " + ", ".join(f"{k} {cell(v)}" for k, v in metrics.items()))
    return results


def write_compare(results: Sequence[ModelResult], out_dir: Path) -> None:
    header = [f for f in asdict(results[0]) if f != "checkpoint"]
    write_table(out_dir, "compare", header, [[getattr(r, f) for f in header] for r in results])
    plot_compare(results, out_dir / "compare.png")


def plot_compare(results: Sequence[ModelResult], path: Path, title: str = "same data, same wall-clock budget"
                 ) -> None:
    """Grouped bars: dev and test BLEU per model, with the parameter count under each name."""
    fig, axes = subplots(1, 1, max(4.0, 1.6 * len(results) + 1.5), 3.6)
    ax = axes[0, 0]
    x = np.arange(len(results))
    for offset, (label, key) in zip((-0.2, 0.2), (("dev", "dev_bleu"), ("test", "test_bleu"))):
        values = [0.0 if math.isnan(getattr(r, key)) else getattr(r, key) for r in results]
        bars = ax.bar(x + offset, values, width=0.4, label=f"{label} BLEU")
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(x, [f"{r.name}\n{r.parameters / 1e6:.1f}M params, {r.train_minutes:.1f} min" for r in results],
                  fontsize=8)
    ax.set_ylabel("sacreBLEU")
    ax.set_title(title)
    ax.margins(y=0.2)  # room above the bars for the legend
    ax.legend(fontsize=8)
    finish(fig, {}, path, dpi=110)


