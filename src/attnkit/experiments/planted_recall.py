"""`attnkit experiment planted-recall`: a task where memory must show. Keys are planted into real text (a marker and
a random key, and D tokens later the marker and the same key again: attnkit.data.planted), models are trained on
the planted training text, and only the recalled key tokens are scored, by D (attnkit.eval.recall).

The models, trained as `attnkit experiment xl-table6` trains them (the same segment of 64, `updates` updates each),
at the Transformer-XL's parameter count: Transformer-XL (segment 64 + memory), the same network without recurrence,
the vanilla Transformer and an LSTM. Each is read as it is trained: Transformer-XL with its evaluation memory
(the preset's eval_mem_len) and the LSTM with its state, carried through B streams in segments; the models without
memory through the window they trained on (the segment: the tokens before each recalled key token, nothing more).
The paper's argument predicts Transformer-XL recalls beyond its segment (its reach grows by a memory per layer),
the models without memory only within their window, and the LSTM less with distance.

Planting (the same for every model; recorded in OUT/planted/data/planting.json, the models in OUT/planted/<model>,
apart from the models of `xl-table6` and `recl`, which share OUT/data and OUT/<model>):
- the marker is the training split's rarest token (Tiny Shakespeare: `<unk>`, which never occurs; its natural
  occurrences elsewhere are overwritten with the most frequent token), so it stands only where it was planted;
- keys of 6 lowercase letters (characters) or 3 words from the 1,000 rarest (words): chance is log 26 = 3.26 and
  log 1000 = 6.91 nats a key token, perfect recall 0;
- training text: D drawn uniformly from 24 .. 768 for every pair (`--train-distances`; `--train-spacing log`:
  log-uniformly, more short pairs), after gaps of 16 .. 64 tokens of text (`--gap`);
- evaluation text (test; valid without one, or with `--split valid` to choose the training text's settings):
  D = 24, 48, 96, 192, 384, 768 in turn, in B rows read as B streams.

OUT/planted_recall.{md,csv,json}: per model and D the recalled key tokens' loss (nats), accuracy (ranked first)
and whole keys recalled; OUT/planted_recall.png: loss and accuracy against D, chance drawn.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit.checkpoint import load_lm_checkpoint
from attnkit.data.lm import LMCorpus, LMVocab, load_lm_corpus
from attnkit.data.planted import Planted, plant
from attnkit.errors import AttnkitError
from attnkit.eval.lm import stream_log_probs, window_log_probs
from attnkit.eval.recall import chance_loss, recall_scores, token_scores
from attnkit.experiments.lm_ablation import best_checkpoint
from attnkit.experiments.tables import write_table
from attnkit.experiments.xl_table6 import equal_updates_config, train_equal_updates
from attnkit.io import atomic_write_json
from attnkit.runtime import resolve_device
from attnkit.viz.figure import finish, subplots

MODELS = {
    "word": ("lm-word-wt2", "lm-word-wt2-no-recurrence-64", "lm-word-wt2-vanilla-64", "lm-word-wt2-lstm-matched"),
    "char": ("lm-char-small-xl", "lm-char-small-no-recurrence-64", "lm-char-small-vanilla-64",
             "lm-char-small-lstm-matched"),
}
PLANTED = "planted"  # OUT/planted: the planted corpus (OUT/planted/data) and the models trained on it


@dataclass(frozen=True)
class Planting:
    """How keys are planted: key length, the evaluation distances, the training distances' range, the gap of text
    before each pair, the size of the word-level key pool, the streams of the evaluation text and the seed."""

    key_len: int
    distances: tuple[int, ...] = (24, 48, 96, 192, 384, 768)
    train_distances: tuple[int, int] = (24, 768)
    train_spacing: str = "uniform"  # training D uniform over its range, or "log": log-uniform (more short pairs)
    gap: tuple[int, int] = (16, 64)
    pool_size: int = 1000
    streams: int = 8
    seed: int = 1


def default_models(level: str) -> list[str]:
    if level not in MODELS:
        raise AttnkitError(f"planted-recall has no default models for a {level}-level corpus: name them with --models")
    return list(MODELS[level])


def default_planting(level: str, **changes) -> Planting:
    return Planting(key_len=6 if level == "char" else 3, **changes)


def training_distances(p: Planting) -> list[int]:
    """What the training text's D is drawn from, uniformly: every D of the range, or for "log" spacing 64
    geometrically spaced ones (a log-uniform draw, rounded: as many pairs below the range's geometric mean as above
    it)."""
    lo, hi = p.train_distances
    if p.train_spacing == "uniform":
        return list(range(lo, hi + 1))
    if p.train_spacing == "log":
        return sorted({int(d) for d in np.geomspace(lo, hi, 64).round()})
    raise AttnkitError(f"planted-recall: the training distances' spacing is uniform or log, not {p.train_spacing!r}")


def planting_tokens(vocab: LMVocab, train: np.ndarray, pool_size: int) -> tuple[int, int, list[int]]:
    """(marker, filler, key pool): the rarest token of the training ids (ties: the highest id), the most frequent
    one, and the keys' pool: lowercase letters (characters), else the pool_size rarest words (not the specials)."""
    counts = np.bincount(train, minlength=vocab.vocab_size)
    order = np.lexsort((-np.arange(counts.size), counts))  # rarest first, ties: the highest id first
    marker, filler = int(order[0]), int(np.argmax(counts))
    if vocab.level == "char":
        pool = [vocab.index[c] for c in string.ascii_lowercase if c in vocab.index]
    else:
        special = {vocab.index.get(tok) for tok in ("<unk>", "<eos>")}
        pool = [int(i) for i in order[1:] if int(i) not in special | {filler}][:pool_size]
    pool = [i for i in pool if i not in (marker, filler)]
    if len(pool) < 2:
        raise AttnkitError(f"planted-recall: the vocabulary of {vocab.vocab_size} tokens leaves no key pool")
    return marker, filler, pool


def plant_corpus(corpus: LMCorpus, p: Planting, *, train_rows: int, lead: int) -> tuple[LMCorpus, dict[str, Planted]]:
    """The corpus with keys planted in every split (training: random distances in `train_rows` rows; the others:
    the evaluation distances in turn, in `p.streams` rows, the first pair after `lead` tokens)."""
    marker, filler, pool = planting_tokens(corpus.vocab, np.asarray(corpus.arrays["train"]), p.pool_size)
    common = dict(marker=marker, filler=filler, key_pool=pool, key_len=p.key_len, gap=p.gap)
    planted = {}
    for i, (name, ids) in enumerate(corpus.arrays.items()):
        ids = np.asarray(ids, dtype=np.int64)  # (N,), read into memory: the corpora planted are small
        if name == "train":
            planted[name] = plant(ids, distances=training_distances(p), rows=train_rows, order="random",
                                  seed=p.seed, **common)
        else:
            planted[name] = plant(ids, distances=p.distances, rows=p.streams, order="cycle", lead=lead,
                                  seed=p.seed + i, **common)
    return LMCorpus(corpus.vocab, {name: pl.flat() for name, pl in planted.items()}), planted


@dataclass
class RecallResult:
    name: str
    kind: str
    parameters: int
    updates: int
    train_minutes: float
    reading: str  # how the model read the stream
    rows: list[dict]  # attnkit.eval.recall.RecallRow as dicts, by distance


def read_recall(run_dir: Path, planted: Planted, device: str) -> tuple[torch.Tensor, str, object]:
    """token_scores (K * Q, 2) of the recalled key tokens as the model reads the planted rows, how it read them,
    and the model."""
    model, _, cfg = load_lm_checkpoint(best_checkpoint(run_dir), resolve_device(device))
    t = cfg.train
    tgt_len, mem_len = t.eval_lengths
    row, col, _, _ = planted.recalled()
    rows = torch.from_numpy(planted.ids)
    if mem_len > 0 and model.kind != "vanilla-lm":
        scores = stream_log_probs(model, rows, row.tolist(), col.tolist(), tgt_len=tgt_len, mem_len=mem_len,
                                  clamp_len=t.clamp_len, reduce=token_scores, device=resolve_device(device))
        how = f"streams, segment {tgt_len} + {'state' if model.kind == 'lstm-lm' else f'memory {mem_len}'}"
    else:
        flat = (row * rows.size(1) + col).tolist()
        scores = window_log_probs(model, rows.reshape(-1), flat, context=t.tgt_len, clamp_len=t.clamp_len,
                                  reduce=token_scores, device=resolve_device(device))
        how = f"window of {t.tgt_len}"
    return scores, how, model


def planted_recall(presets: Sequence[str], data_dir: Path, out_dir: Path, updates: int, *,
                   planting: Planting | None = None, overrides: Sequence[str] = (), device: str = "auto",
                   split: str | None = None, force: bool = False, progress: bool = True,
                   say: Callable[[str], None] = print) -> dict:
    """Plant keys into the corpus of `data_dir`, train every preset on it for `updates` updates, score recall by D
    on `split` (default: test, or valid where there is none; valid to choose the planting's settings)."""
    corpus = load_lm_corpus(data_dir)
    level = corpus.vocab.level
    p = planting or default_planting(level)
    configs = [equal_updates_config(preset, updates, overrides) for preset in presets]
    window = max(c.train.tgt_len for c in configs)
    planted_corpus, planted = plant_corpus(corpus, p, train_rows=configs[0].train.batch_size, lead=window)
    target = out_dir / PLANTED / "data"  # apart from OUT/<model>: xl-table6's models of the same names
    target.mkdir(parents=True, exist_ok=True)
    planted_corpus.save(target)
    marker = int(planted["train"].marker)
    record = {"planting": asdict(p), "marker": marker, "marker_token": _token(corpus.vocab, marker),
              "key_pool": len(planting_tokens(corpus.vocab, np.asarray(corpus.arrays["train"]), p.pool_size)[2]),
              "pairs": {name: int(pl.row.size) for name, pl in planted.items()}}
    atomic_write_json(target / "planting.json", record)
    say(f"planted {record['pairs']} pairs (marker {record['marker_token']!r}, keys of {p.key_len} from "
        f"{record['key_pool']} tokens) in {target}")
    trained = train_equal_updates(presets, target, out_dir / PLANTED, updates, overrides=overrides, force=force,
                                  progress=progress, say=say)
    split = split or ("test" if "test" in planted else "valid")
    if split not in planted:
        raise AttnkitError(f"planted-recall: {data_dir} has no {split} split (it has {', '.join(planted)})")
    results = []
    for t in trained:
        scores, how, model = read_recall(out_dir / PLANTED / t.name, planted[split], device)
        rows = recall_scores(planted[split], scores.numpy())
        results.append(RecallResult(t.name, model.kind, sum(x.numel() for x in model.parameters()), t.steps,
                                    t.elapsed_s / 60, how, [r.as_dict() for r in rows]))
        say(f"{t.name} ({how}): " + ", ".join(f"D {r.distance}: {r.loss:.2f} nats, {r.accuracy:.0%}" for r in rows))
    summary = {"level": level, "split": split, "updates": updates, "chance_loss": chance_loss(record["key_pool"]),
               "chance_accuracy": 1 / record["key_pool"], **record, "models": [asdict(r) for r in results]}
    write_recall(summary, out_dir)
    return summary


def _token(vocab: LMVocab, i: int) -> str:
    return vocab.tokens[i] if vocab.tokens else str(i)


def write_recall(summary: dict, out_dir: Path) -> None:
    header = ["model", "kind", "parameters", "updates", "train min", "read as", "D", "keys", "loss (nats)",
              "accuracy", "whole keys"]
    table = [[m["name"], m["kind"], m["parameters"], m["updates"], m["train_minutes"], m["reading"], r["distance"],
              r["keys"], r["loss"], r["accuracy"], r["whole_keys"]] for m in summary["models"] for r in m["rows"]]
    write_table(out_dir, "planted_recall", header, table)
    atomic_write_json(out_dir / "planted_recall.json", summary)
    plot_recall(summary, out_dir / "planted_recall.png")


def plot_recall(summary: dict, path: Path) -> None:
    """Recalled key tokens' loss and accuracy against the distance D, one line per model, chance dashed."""
    fig, axes = subplots(1, 2, 5.0, 3.6)
    for m in summary["models"]:
        ds = [r["distance"] for r in m["rows"]]
        axes[0, 0].plot(ds, [r["loss"] for r in m["rows"]], marker="o", label=m["name"])
        axes[0, 1].plot(ds, [r["accuracy"] for r in m["rows"]], marker="o", label=m["name"])
    axes[0, 0].axhline(summary["chance_loss"], color="grey", ls="--", lw=1, label="chance (uniform over the keys)")
    axes[0, 1].axhline(summary["chance_accuracy"], color="grey", ls="--", lw=1)
    for ax, label in ((axes[0, 0], "loss of the recalled key tokens (nats)"), (axes[0, 1], "accuracy (ranked first)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("distance D between the key and its recall (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0, 1].set_ylim(-0.02, 1.02)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"planted recall, {summary['updates']:,} updates each", fontsize=10)
    finish(fig, {}, path, dpi=110)
