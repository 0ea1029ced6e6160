"""`attnkit experiment xl-table6`: Transformer-XL's ablation as the paper's table 6 measures it (Dai et al. 2019,
section 4.2; beside it a no-recurrence row at twice XL's backprop length, equal attention length, where the paper's
table 10 compares at equal memory): every model trains on the same segment (backprop length) for
the same number of updates, Transformer-XL's memory is context on top of it, and each is scored as the reference's
eval.py scores it, at the attention length it trained with and at the best one.

The models, each a preset at the size of the corpus's Transformer-XL (`attnkit presets` describes them):

| row (WikiText-2 preset)        | positions                     | training                                       |
|--------------------------------|-------------------------------|------------------------------------------------|
| lm-word-wt2                    | relative                      | segment 64 + memory 64                          |
| lm-word-wt2-no-recurrence-64   | relative                      | segment 64, no memory (the same network)        |
| lm-word-wt2-no-recurrence      | relative                      | segment 128: the XL's attention length (tab. 10)|
| lm-word-wt2-absolute           | absolute, within segments     | segment 64 + memory 64 (section 3.3)            |
| lm-word-wt2-vanilla-64         | absolute                      | segment 64, no memory                           |
| lm-word-wt2-lstm-matched       | none (a recurrent state)      | segments of 64, the state carried               |

(Tiny Shakespeare: lm-char-small-xl and the lm-char-small-* presets of the same names.) Every model makes `updates`
updates of batch x segment tokens (the 128-token row twice as many tokens each); its cosine decays over them; the
wall time and training tokens/s are recorded beside (they include the periodic validation the trainer does).

Evaluation at attention length L (every token reads exactly L positions at each layer, itself included):
- relative positions (the XL and both no-recurrence rows): as the reference evaluates any model (its eval.py with
  --same_length --mem_len L --clamp_len C): segments of T carry a memory of L, and `same_length` lets every query
  see the L keys before it, no more (a copy of the model with `model.same_length` on); distances beyond C use C's
  encoding. A model trained without a memory gets one here, as the reference's evaluation gives it.
- absolute positions with recurrence: segments of T over a memory of L - T (no same_length: its positions restart
  every segment; the paper's section 3.3 explains why it fails at longer memories).
- the vanilla LM: the sliding window of L (one prediction per window, Al-Rfou et al.), only at L up to the segment
  it trained on (absolute positions beyond it were never trained; the paper scores it so).
- the LSTM: its state carried through the stream; it has no attention length, so both columns are that figure.

Table 6's two columns: perplexity (bits per character on characters) at the training attention length (the
longest attention in training: memory + segment; the segment without memory) and at the best (L, C), chosen on the
validation split and reported on the test split. A corpus without a test split (Tiny Shakespeare) has its
validation split cut in two: the choices on the first half, the figures on the second.

OUT/xl_table6.{md,csv,json,png}; the models in OUT/<model>, resumable and never mixed (attnkit.experiments.runs), the
scores cached in OUT/<model>/eval/table6.json by checkpoint and data. `attnkit experiment recl` and
`planted-recall` train the same presets the same way (`train_equal_updates`), so an OUT shared with them trains
each model once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from attnkit import config as cfgmod
from attnkit.checkpoint import load_lm_checkpoint
from attnkit.data.lm import load_lm_corpus
from attnkit.errors import AttnkitError
from attnkit.eval.lm import evaluate_segments, evaluate_sliding_window
from attnkit.experiments.lm_ablation import FINISHED, best_checkpoint, describe, metric, train_model
from attnkit.experiments.runs import clear_run, evaluation_key, refuse_other_run, run_identity
from attnkit.experiments.tables import write_table
from attnkit.io import atomic_write_json
from attnkit.models import build_model
from attnkit.runtime import resolve_device
from attnkit.viz.figure import finish, subplots

TABLE6 = {
    "word": ("lm-word-wt2", "lm-word-wt2-no-recurrence-64", "lm-word-wt2-no-recurrence", "lm-word-wt2-absolute",
             "lm-word-wt2-vanilla-64", "lm-word-wt2-lstm-matched"),
    "char": ("lm-char-small-xl", "lm-char-small-no-recurrence-64", "lm-char-small-no-recurrence",
             "lm-char-small-absolute", "lm-char-small-vanilla-64", "lm-char-small-lstm-matched"),
}
LENGTHS = {"word": (64, 128, 256, 512), "char": (64, 128, 256, 512, 1024)}
TRAIN_LENGTH = "train"  # a clamp_len candidate: the model's training attention length


def table6_presets(level: str) -> list[str]:
    if level not in TABLE6:
        raise AttnkitError(f"xl-table6 has no default models for a {level}-level corpus: name them with --models")
    return list(TABLE6[level])


# --- training: one segment, one number of updates -----------------------------------------------------------------
def equal_updates_config(preset: str, updates: int, overrides: Sequence[str]) -> cfgmod.LMRunConfig:
    """The run config of `preset` trained for exactly `updates` updates, its cosine decaying over them."""
    if updates < 1:
        raise AttnkitError(f"--updates must be positive, not {updates}")
    budget = [f"train.max_steps={updates}", "train.max_minutes=0", "train.horizon=steps"]
    return cfgmod.resolve([preset], [*overrides, *budget], cls=cfgmod.LMRunConfig)


@dataclass
class Trained:
    """A model trained for the experiment: its name (folder), preset, config and what training cost."""

    name: str
    preset: str
    config: cfgmod.LMRunConfig
    steps: int = 0
    elapsed_s: float = 0.0

    @property
    def tok_s(self) -> float:
        t = self.config.train
        return self.steps * t.batch_size * t.tgt_len * t.accumulate / max(self.elapsed_s, 1e-9)


def train_equal_updates(presets: Sequence[str], data_dir: Path, out_dir: Path, updates: int, *,
                        overrides: Sequence[str] = (), force: bool = False, progress: bool = True,
                        say: Callable[[str], None] = print) -> list[Trained]:
    """Train every preset on `data_dir` for `updates` updates in OUT/<preset name>, reusing a finished model of the
    same settings and data, refusing one of others (every model checked before any trains) unless `force`."""
    names = [Path(p).stem for p in presets]
    if len(set(names)) != len(names):
        raise AttnkitError(f"model names repeat ({', '.join(names)}); each needs its own folder")
    configs = [equal_updates_config(p, updates, overrides) for p in presets]
    identities = [run_identity(cfg, data_dir) for cfg in configs]
    for name, identity in zip(names, identities):
        if force:
            clear_run(out_dir / name)
        refuse_other_run(out_dir / name, identity, "pass --force to train the models again, or choose another --out")
    out = []
    for preset, name, cfg, identity in zip(presets, names, configs, identities):
        train_model(preset, cfg, data_dir, out_dir / name, identity=identity, progress=progress, say=say)
        done = json.loads((out_dir / name / FINISHED).read_text(encoding="utf-8"))
        out.append(Trained(name, preset, cfg, int(done["step"]), float(done["elapsed_s"])))
    return out


# --- evaluation: the reference's same_length / clamp_len ------------------------------------------------------------
def with_same_length(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a Transformer-XL whose every query attends to mem_len keys (the reference's --same_length)."""
    copy = build_model(model.kind, cfgmod.replace(model.config, same_length=True))
    copy.load_state_dict(model.state_dict())
    return copy.to(next(model.parameters()).device).eval()


def training_length(kind: str, train: cfgmod.LMTrainConfig) -> int | None:
    """The longest attention of training (memory + segment; the segment without memory); None for the LSTM."""
    if kind == "lstm-lm":
        return None
    return train.tgt_len + (train.mem_len if kind in ("transformer-xl", "recurrent-vanilla-lm") else 0)


def clamp_values(kind: str, length: int, trained: int | None, clamps: Sequence[int | str]) -> list[int]:
    """The clamp_len values worth scoring at attention length L: only relative positions use one, and a clamp at
    or above L changes nothing (every distance is below L)."""
    if kind != "transformer-xl":
        return [0]
    values = {trained if c == TRAIN_LENGTH else int(c) for c in clamps}
    return sorted({0} | {c for c in values if c and c < length})


def score(model, ids: torch.Tensor, *, kind: str, train: cfgmod.LMTrainConfig, length: int, clamp: int, segment: int,
          streams: int, max_tokens: int, device: torch.device) -> float | None:
    """Mean NLL of ids at attention length L (see the module docstring); None where the model is not scored."""
    t = min(segment, length)
    common = dict(batch_size=streams, max_tokens=max_tokens, device=device)
    if kind == "transformer-xl":
        return evaluate_segments(model, ids, tgt_len=t, mem_len=length, clamp_len=clamp, **common).loss
    if kind == "recurrent-vanilla-lm":
        return evaluate_segments(model, ids, tgt_len=t, mem_len=length - t, **common).loss
    if kind == "vanilla-lm":
        if length > train.tgt_len:
            return None
        return evaluate_sliding_window(model, ids, window=length, batch_size=8 * streams, max_tokens=max_tokens,
                                       device=device).loss
    return evaluate_segments(model, ids, tgt_len=segment, mem_len=max(1, train.mem_len), **common).loss  # state


def evaluation_splits(data_dir: Path) -> tuple[tuple[str, torch.Tensor], tuple[str, torch.Tensor]]:
    """((name, ids) the choices are made on, (name, ids) reported): valid and test, or the two halves of valid."""
    splits = load_lm_corpus(data_dir).splits
    if "valid" not in splits:
        raise AttnkitError(f"{data_dir} has no valid split to choose the attention length on")
    if "test" in splits:
        return ("valid", splits["valid"]), ("test", splits["test"])
    half = splits["valid"].numel() // 2
    return ("valid-first-half", splits["valid"][:half]), ("valid-second-half", splits["valid"][half:])


@dataclass
class Table6Row:
    name: str
    kind: str
    positions: str
    recurrence: str
    segment: int  # training segment (backprop length)
    memory: int  # training memory (0: none; the LSTM's: its state)
    parameters: int
    updates: int
    train_minutes: float
    tok_s: float
    train_length: int | None  # attention length of training (None: the LSTM)
    selection: dict[str, float] = field(default_factory=dict)  # "L/C" -> loss on the selection split
    best: str = ""  # the "L/C" of the lowest selection loss
    at_train: float = math.nan  # report-split loss at the training length (clamp none)
    at_best: float = math.nan  # report-split loss at `best`


def _key(length: int | None, clamp: int) -> str:
    return "state" if length is None else f"{length}/{clamp}"


class ScoreCache:
    """Scores of one checkpoint on one data folder, kept in OUT/<model>/eval/table6.json across runs."""

    def __init__(self, run_dir: Path, data_dir: Path, settings: str):
        self.path = run_dir / "eval" / "table6.json"
        self.prefix = f"{evaluation_key(best_checkpoint(run_dir), data_dir)}|{settings}|"
        try:
            self.data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.data = {}

    def get(self, split: str, key: str, compute: Callable[[], float | None]) -> float | None:
        name = f"{self.prefix}{split}|{key}"
        if name not in self.data:
            self.data[name] = compute()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, self.data)
        return self.data[name]


def evaluate_model(trained: Trained, run_dir: Path, data_dir: Path, lengths: Sequence[int],
                   clamps: Sequence[int | str], *, segment: int, streams: int, max_tokens: int, device: str,
                   say: Callable[[str], None]) -> Table6Row:
    """Score one trained model on the selection split at every (L, C), then on the report split at its training
    length and at the best (L, C)."""
    dev = resolve_device(device)
    model, _, cfg = load_lm_checkpoint(best_checkpoint(run_dir), dev)
    kind, train = model.kind, cfg.train
    if kind == "transformer-xl":
        model = with_same_length(model)
    trained_len = training_length(kind, train)
    (select_name, select_ids), (report_name, report_ids) = evaluation_splits(data_dir)
    cache = ScoreCache(run_dir, data_dir, f"T{segment}-B{streams}-N{max_tokens}")

    def at(split: str, ids: torch.Tensor, length: int | None, clamp: int) -> float | None:
        def compute() -> float | None:
            loss = score(model, ids, kind=kind, train=train, length=length or segment, clamp=clamp, segment=segment,
                         streams=streams, max_tokens=max_tokens, device=dev)
            say(f"{run_dir.name} on {split} at {_key(length, clamp)}: "
                f"{'not scored' if loss is None else f'{loss:.4f} nats'}")
            return loss
        return cache.get(split, _key(length, clamp), compute)

    grid = [(None, 0)] if trained_len is None else [
        (length, clamp) for length in sorted(set(lengths) | {trained_len})
        for clamp in clamp_values(kind, length, trained_len, clamps)]
    grid = [(length, clamp) for length, clamp in grid if kind != "vanilla-lm" or length <= train.tgt_len]
    # with one candidate there is nothing to choose: no pass over the selection split (the sliding window is slow)
    selection = {} if len(grid) == 1 else {_key(*g): at(select_name, select_ids, *g) for g in grid}
    best = min(selection, key=selection.__getitem__) if selection else _key(*grid[0])
    best_length, best_clamp = (None, 0) if best == "state" else map(int, best.split("/"))
    positions, recurrence = describe(kind, train.mem_len)
    return Table6Row(run_dir.name, kind, positions, recurrence, train.tgt_len, train.mem_len,
                     sum(p.numel() for p in model.parameters()), trained.steps, trained.elapsed_s / 60, trained.tok_s,
                     trained_len, selection, best, at(report_name, report_ids, trained_len, 0),
                     at(report_name, report_ids, best_length, best_clamp))


# --- the experiment -----------------------------------------------------------------------------------------------
def xl_table6(presets: Sequence[str], data_dir: Path, out_dir: Path, updates: int, *, lengths: Sequence[int] = (),
              clamps: Sequence[int | str] = (0, TRAIN_LENGTH), segment: int = 64, streams: int = 8,
              max_tokens: int = 0, device: str = "auto", overrides: Sequence[str] = (), force: bool = False,
              progress: bool = True, say: Callable[[str], None] = print) -> dict:
    """Train every preset for `updates` updates, score each as the module docstring says, write the tables."""
    level = load_lm_corpus(data_dir).vocab.level
    lengths = sorted(set(lengths or LENGTHS.get(level, LENGTHS["word"])))
    if lengths[0] < 1 or segment < 1 or streams < 1 or max_tokens < 0:
        raise AttnkitError("xl-table6: attention lengths, --segment and --eval-batch-size must be positive")
    trained = train_equal_updates(presets, data_dir, out_dir, updates, overrides=overrides, force=force,
                                  progress=progress, say=say)
    rows = [evaluate_model(t, out_dir / t.name, data_dir, lengths, clamps, segment=segment, streams=streams,
                           max_tokens=max_tokens, device=device, say=say) for t in trained]
    (select_name, _), (report_name, _) = evaluation_splits(data_dir)
    summary = {"level": level, "updates": updates, "segment": segment, "streams": streams, "max_tokens": max_tokens,
               "lengths": lengths, "clamps": [str(c) for c in clamps], "chosen_on": select_name,
               "reported_on": report_name, "models": [asdict(r) for r in rows]}
    write_table6(rows, level, out_dir, summary)
    return summary


def _length_label(row: Table6Row) -> str:
    if row.best == "state":
        return "state"
    length, clamp = row.best.split("/")
    return f"{int(length):,}" + (f", clamp {int(clamp):,}" if int(clamp) else "")


def write_table6(rows: list[Table6Row], level: str, out_dir: Path, summary: dict) -> None:
    name = "bpc" if level == "char" else "ppl"
    header = ["model", "kind", "positions", "recurrence", "segment", "memory", "parameters", "updates", "train min",
              "train tok/s", "training length", f"{name} @training length", f"{name} @best", "best length"]
    table = [[r.name, r.kind, r.positions, r.recurrence, r.segment, r.memory, r.parameters, r.updates,
              r.train_minutes, r.tok_s, "state" if r.train_length is None else r.train_length,
              metric(r.at_train, level), metric(r.at_best, level), _length_label(r)] for r in rows]
    write_table(out_dir, "xl_table6", header, table)
    atomic_write_json(out_dir / "xl_table6.json", summary)
    plot_table6(rows, level, summary, out_dir / "xl_table6.png")


def plot_table6(rows: list[Table6Row], level: str, summary: dict, path: Path) -> None:
    """Selection-split perplexity (bpc) against the attention length, one line per model with a choice of lengths
    (no clamp; dotted: the best clamp at each length)."""
    fig, axes = subplots(1, 1, 6.4, 4.0)
    ax = axes[0, 0]
    for row in rows:
        if len(row.selection) < 2:  # one attention length (the vanilla LM) or none (the LSTM): in the table only
            continue
        by_length: dict[int, dict[int, float]] = {}
        for key, loss in row.selection.items():
            length, clamp = map(int, key.split("/"))
            by_length.setdefault(length, {})[clamp] = loss
        xs = sorted(by_length)
        line = ax.plot(xs, [metric(by_length[x].get(0, math.nan), level) for x in xs], marker="o", label=row.name)
        if any(len(v) > 1 for v in by_length.values()):
            ax.plot(xs, [metric(min(by_length[x].values()), level) for x in xs], ls=":", color=line[0].get_color())
    ax.set_xscale("log", base=2)
    ax.set_xticks(summary["lengths"], [str(length) for length in summary["lengths"]])
    ax.set_xlabel("attention length at evaluation (same_length: every token reads this many)")
    ax.set_ylabel(("bits per character" if level == "char" else "perplexity") + f" on {summary['chosen_on']}")
    ax.set_title(f"equal segment, {summary['updates']:,} updates each (dotted: best clamp_len)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    finish(fig, {}, path, dpi=110)

