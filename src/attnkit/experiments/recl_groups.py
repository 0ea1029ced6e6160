"""`attnkit experiment recl`: the relative effective context length as the paper's appendix C computes it (Dai et al.
2019, section 4.3, table 8, figure 3), on groups of models of equal parameter count.

- Two groups, as the paper's: {Transformer-XL, an RNN} for its "80% longer than RNNs" and {Transformer-XL, the same
  network without recurrence, a vanilla Transformer} for its "450% longer than vanilla Transformers" (the paper's
  RNNs are an LSTM and a QRNN; attnkit has the LSTM). The presets are of equal size: WikiText-2 6.53M (XL),
  6.56M (lm-word-wt2-lstm-matched), 6.53M (lm-word-wt2-vanilla-64); Tiny Shakespeare 1.94M each.
- Contexts step uniformly: c = Delta, 2 Delta, ... up to the longest (attnkit.eval.recl refuses another grid).
- Every scored token's context is exactly c: each of K target tokens (evenly spaced over the split) is predicted from
  the c tokens before it and nothing else (attnkit.eval.lm.evaluate_windows: no memory or state from before the
  window). A Transformer reads the window in one pass (for Transformer-XL the same as segments with a memory that
  holds the whole window); absolute positions with recurrence read it in segments of the length they trained on.
- The vanilla Transformer is scored only up to the segment it trained on, as the paper scores it (its RECL is at
  most that length); beyond it, it takes no part in the group's baseline.
- r = 0.1, 0.5 and 1.0; the threshold 0.01.

Models are trained as `attnkit experiment xl-table6` trains them (the same segment, `updates` updates each; an OUT
shared with it trains each once). OUT/recl.{md,csv,json}: RECL per group, model and r, and how much longer the
group's first model's (the XL's) is; OUT/recl.png: every model's relative gain g(c, c + Delta) against c, one panel
per group and r (like the paper's figure 3, which draws the unnormalised gain), the threshold drawn. Per-token
losses are kept in OUT/<model>/eval/.

A member may also be a checkpoint, LABEL=PATH (an imported Transformer-XL, say: `attnkit import --from
transformer-xl`, its text prepared with `attnkit lm prepare --vocab-from PATH`): scored as it is, never trained. A
group of one model measures that model's RECL against itself: how far more context still gains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit.checkpoint import load_lm_checkpoint
from attnkit.data.lm import LMCorpus, load_lm_corpus
from attnkit.errors import AttnkitError
from attnkit.eval.lm import evaluate_windows
from attnkit.eval.recl import recl, relative_gains, uniform_contexts
from attnkit.experiments.lm_ablation import best_checkpoint
from attnkit.experiments.runs import evaluation_key
from attnkit.experiments.tables import write_table
from attnkit.experiments.xl_table6 import Trained, train_equal_updates
from attnkit.io import atomic_write_json
from attnkit.runtime import resolve_device
from attnkit.viz.figure import finish, subplots

GROUPS = {
    "word": {"rnn": ("lm-word-wt2", "lm-word-wt2-lstm-matched"),
             "transformer": ("lm-word-wt2", "lm-word-wt2-no-recurrence-64", "lm-word-wt2-vanilla-64")},
    "char": {"rnn": ("lm-char-small-xl", "lm-char-small-lstm-matched"),
             "transformer": ("lm-char-small-xl", "lm-char-small-no-recurrence-64", "lm-char-small-vanilla-64")},
}
GRID = {"word": (32, 512), "char": (64, 1024)}  # Delta and the longest context
PASS_TOKENS = 4096  # window tokens per forward pass at most: longer passes spend their time allocating attention


def default_groups(level: str) -> dict[str, list[str]]:
    if level not in GROUPS:
        raise AttnkitError(f"recl has no default groups for a {level}-level corpus: name them with --group")
    return {name: list(members) for name, members in GROUPS[level].items()}


def target_positions(n: int, longest: int, count: int) -> np.ndarray:
    """`count` positions evenly spaced over longest .. n - 1: every one has `longest` tokens before it."""
    if n - longest < count or count < 1:
        raise AttnkitError(f"recl: {n:,} tokens hold fewer than {count:,} targets with {longest:,} tokens before "
                           "each; score fewer (--tokens) or shorter contexts (--longest)")
    return np.linspace(longest, n - 1, count).round().astype(np.int64)


def contexts_of(kind: str, tgt_len: int, grid: Sequence[int]) -> list[int]:
    """The contexts a model is scored at: the vanilla Transformer only up to the segment it trained on."""
    out = [c for c in grid if kind != "vanilla-lm" or c <= tgt_len]
    return out or list(grid[:1])


def load_member(path: Path, corpus: LMCorpus, data_dir: Path, device: str) -> tuple[torch.nn.Module, object]:
    """(model on the device, its run config) of a member's checkpoint, refused when its vocabulary is not that of
    `corpus` (prepared in `data_dir`)."""
    model, _, cfg = load_lm_checkpoint(path, resolve_device(device))
    if corpus.vocab.vocab_size != cfg.model.vocab_size:
        raise AttnkitError(f"recl: {path} has a vocabulary of {cfg.model.vocab_size:,}, {data_dir} one of "
                           f"{corpus.vocab.vocab_size:,}: prepare the text with `attnkit lm prepare --vocab-from "
                           f"{path}`")
    return model, cfg


def window_losses(path: Path, model: torch.nn.Module, cfg, run_dir: Path, data_dir: Path, split: str,
                  ids: torch.Tensor, positions: np.ndarray, grid: Sequence[int], *, clamp_len: int, batch_size: int,
                  say: Callable[[str], None]) -> dict[int, np.ndarray]:
    """Per-token losses (K,) of `model` (loaded from the checkpoint `path`, with its config `cfg`) at each of its
    contexts over `ids` (N,), the `split` of `data_dir`, read from `run_dir`/eval/ when this checkpoint scored these
    tokens before."""
    key = evaluation_key(path, data_dir)
    dev = next(model.parameters()).device
    segment = cfg.train.tgt_len if model.kind == "recurrent-vanilla-lm" else None
    first, last = int(positions[0]), int(positions[-1])
    out = {}
    for c in contexts_of(model.kind, cfg.train.tgt_len, grid):
        cache = run_dir / "eval" / f"recl-{split}-C{c}-K{positions.size}-{first}-{last}-clamp{clamp_len}-{key}.npy"
        if cache.is_file():
            out[c] = np.load(cache)
            continue
        losses = evaluate_windows(model, ids, positions.tolist(), context=c, segment=segment, clamp_len=clamp_len,
                                  batch_size=max(1, min(batch_size, PASS_TOKENS // c)), device=dev).numpy()
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, losses)
        out[c] = losses
        say(f"{run_dir.name} with exactly {c} tokens of context: {losses.mean():.4f} nats over {losses.size:,} tokens")
    return out


def recl_groups(groups: Mapping[str, Sequence[str]], data_dir: Path, out_dir: Path, updates: int | None, *,
                delta: int = 0,
                longest: int = 0, tokens: int = 2048, rs: Sequence[float] = (0.1, 0.5, 1.0), threshold: float = 0.01,
                clamp_len: int = 0, batch_size: int = 64, device: str = "auto", overrides: Sequence[str] = (),
                force: bool = False, progress: bool = True, say: Callable[[str], None] = print) -> dict:
    """Train the groups' preset members for `updates` updates each (a LABEL=PATH member is a checkpoint, scored as
    it is), score every model with exact contexts, RECL per group and r."""
    level = load_lm_corpus(data_dir).vocab.level
    d, top = GRID.get(level, GRID["word"])
    grid = uniform_contexts(delta or d, longest or top)
    if not all(0 < r <= 1 for r in rs):
        raise AttnkitError(f"recl: r is a fraction of the tokens in (0, 1], not {list(rs)}")
    members = list(dict.fromkeys(m for ms in groups.values() for m in ms))
    checkpoints = dict(_checkpoint_member(m) for m in members if "=" in m)  # label -> path
    presets = [m for m in members if "=" not in m]
    if presets and not updates:
        raise AttnkitError(f"recl: --updates is needed to train {', '.join(presets)}")
    trained = {t.preset: t for t in train_equal_updates(presets, data_dir, out_dir, updates, overrides=overrides,
                                                        force=force, progress=progress, say=say)} if presets else {}
    models = {p: Model(t.name, best_checkpoint(out_dir / t.name), t) for p, t in trained.items()}
    models.update({f"{label}={path}": Model(label, path) for label, path in checkpoints.items()})
    names = [m.name for m in models.values()]
    if len(set(names)) != len(names):
        raise AttnkitError(f"recl: model names repeat ({', '.join(names)}); label each checkpoint apart")
    corpus = load_lm_corpus(data_dir)
    split = "test" if "test" in corpus.arrays else "valid"
    ids = corpus.splits[split]
    positions = target_positions(ids.numel(), grid[-1], tokens)
    losses, described = {}, {}
    for m, member in models.items():  # each checkpoint and the split read once
        model, cfg = load_member(member.path, corpus, data_dir, device)
        losses[m] = window_losses(member.path, model, cfg, out_dir / member.name, data_dir, split, ids, positions,
                                  grid, clamp_len=clamp_len, batch_size=batch_size, say=say)
        described[member.name] = _describe(member, model, cfg, grid)
    results = {}
    for group, group_members in groups.items():
        by_model = {models[m].name: losses[m] for m in group_members}
        results[group] = {f"r={r:g}": {"recl": recl(by_model, r, threshold), "gains": relative_gains(by_model, r)}
                          for r in rs}
    summary = {"level": level, "split": split, "tokens": int(positions.size), "contexts": grid,
               "delta": grid[1] - grid[0], "threshold": threshold, "updates": updates if presets else None,
               "clamp_len": clamp_len, "models": described,
               "groups": {g: [models[m].name for m in ms] for g, ms in groups.items()}, "results": results}
    write_recl(summary, out_dir)
    return summary


@dataclass(frozen=True)
class Model:
    """A member of a group: its name (table row, OUT/<name>/eval/), its checkpoint, and how it was trained here
    (None: a checkpoint given as it is)."""

    name: str
    path: Path
    trained: Trained | None = None


def _checkpoint_member(member: str) -> tuple[str, Path]:
    """LABEL=PATH -> (label, path), the file checked."""
    label, _, path = member.partition("=")
    if not label or not Path(path).is_file():
        raise AttnkitError(f"recl: a checkpoint member is LABEL=PATH to a language-model checkpoint, not {member!r}")
    return label, Path(path)


def _describe(m: Model, model: torch.nn.Module, cfg, grid: Sequence[int]) -> dict:
    t = m.trained
    return {"preset": t.preset if t else None, "checkpoint": str(m.path), "kind": model.kind,
            "parameters": sum(p.numel() for p in model.parameters()), "updates": t.steps if t else "",
            "train_minutes": t.elapsed_s / 60 if t else None, "tok_s": t.tok_s if t else None,
            "longest_context": contexts_of(model.kind, cfg.train.tgt_len, grid)[-1]}


def write_recl(summary: dict, out_dir: Path) -> None:
    rs = list(next(iter(summary["results"].values())))
    header = ["group", "model", "kind", "parameters", "updates", "contexts up to"] + [f"RECL {r}" for r in rs] + \
             [f"1st model's RECL vs this, {r}" for r in rs]
    table = []
    for group, names in summary["groups"].items():
        found = summary["results"][group]
        for name in names:
            m = summary["models"][name]
            mine = [found[r]["recl"][name] for r in rs]
            first = [found[r]["recl"][names[0]] for r in rs]
            versus = ["" if name == names[0] else f"{(a / b - 1) * 100:+.0f}%" for a, b in zip(first, mine)]
            table.append([group, name, m["kind"], m["parameters"], m["updates"], m["longest_context"], *mine, *versus])
    write_table(out_dir, "recl", header, table)
    atomic_write_json(out_dir / "recl.json", summary)
    plot_gains(summary, out_dir / "recl.png")


def plot_gains(summary: dict, path: Path) -> None:
    """One panel per group (rows) and r (columns): each model's relative gain g(c, c + Delta) against c, and the
    threshold; where a curve first falls below it is the model's RECL."""
    groups, rs = list(summary["groups"]), list(next(iter(summary["results"].values())))
    fig, axes = subplots(len(groups), len(rs), 4.2, 3.2)
    for i, group in enumerate(groups):
        for j, r in enumerate(rs):
            ax = axes[i, j]
            for name, steps in summary["results"][group][r]["gains"].items():
                if steps:
                    ax.plot([s[0] for s in steps], [s[2] for s in steps], marker="o", ms=3,
                            label=f"{name} (RECL {summary['results'][group][r]['recl'][name]})")
            ax.axhline(summary["threshold"], color="grey", ls="--", lw=1)
            ax.set_title(f"{group} group, {r}", fontsize=9)
            ax.set_xlabel("context c (tokens)")
            ax.set_ylabel(f"relative gain g(c, c + {summary['delta']})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
    finish(fig, {}, path, dpi=100)
