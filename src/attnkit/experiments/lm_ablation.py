"""`attnkit experiment lm-ablation`: recurrence x positional encoding (Dai et al. 2019, section 4.3) on one corpus and
one wall-clock budget per model: the equal-time view. The paper's own measurements (equal segment and updates,
same_length evaluation; RECL with exact contexts and equal-parameter groups) are `attnkit experiment xl-table6` and
`attnkit experiment recl` (attnkit.experiments.xl_table6, recl_groups).

Five models by default, each a preset (`attnkit presets` describes them), at the size of the corpus's Transformer-XL
(`lm-word-wt2`, `lm-char-small-xl`) and with the same attention length in training (segment 64 + memory 64, or
segments of 128); the others are named by the family and a suffix (`lm-word-wt2-lstm`, `lm-char-small-lstm`):

| preset suffix      | kind                  | positions                       | recurrence        |
|--------------------|-----------------------|---------------------------------|-------------------|
| (the XL's name)    | transformer-xl        | relative                        | memory            |
| -no-recurrence     | transformer-xl        | relative                        | none (mem_len 0)  |
| -absolute          | recurrent-vanilla-lm  | absolute, within each segment   | memory            |
| -vanilla           | vanilla-lm            | absolute                        | none              |
| -lstm              | lstm-lm               | none (a recurrent state)        | state             |

Each model is evaluated at several attention lengths L (the tokens a prediction may attend to: memory + segment):
a model trained with a memory of positions carries a memory of L - T positions between segments of T; the others
read the L - T tokens before each segment again as plain context, so nothing is carried (the LSTM starts from a zero
state there: its context is the L - T tokens before the segment and the segment's own). A token of a segment is so
predicted from between L - T and L - 1 tokens before it (more through a carried memory's own memory). Every
evaluation reads the same split as the same B streams, so the per-token losses line up token by token across models
and lengths; they are kept (OUT/<model>/eval/*.npy).

OUT/lm_ablation.{md,csv}: perplexity (bits per character for a character-level corpus) by model x attention length
and the best of each row; OUT/lm_ablation.json: everything; OUT/lm_ablation.png.
Resumable, and never mixed: each model's resolved config (budget and overrides included) and data fingerprint are
recorded beside it (OUT/<model>/identity.json, `attnkit.experiments.runs`). A rerun with the same ones does not train
a finished model (OUT/<model>/finished.json) again, resumes one with a checkpoint, and reads the losses on disk of
the same checkpoint (their file names hold its key); a rerun with others refuses in one line naming the difference,
and `force` trains every model anew. OUT/data, prepared from a named corpus, is used for that corpus only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from attnkit import config as cfgmod
from attnkit.checkpoint import load_checkpoint, load_lm_checkpoint
from attnkit.data.lm import CORPUS_FILE, load_lm_corpus, prepare_lm
from attnkit.errors import AttnkitError
from attnkit.eval.lm import evaluate_segments
from attnkit.experiments.runs import clear_run, evaluation_key, record_run, refuse_other_run, run_identity
from attnkit.experiments.tables import cell, write_table
from attnkit.io import atomic_write_json
from attnkit.runtime import resolve_device
from attnkit.viz.curves import CurveGroup, level_metric
from attnkit.viz.figure import finish, subplots

ABLATION_SUFFIXES = ("-no-recurrence", "-absolute", "-vanilla", "-lstm")  # after the Transformer-XL's own name
FINISHED = "finished.json"
PREPARED_FROM = "prepared_from.json"  # in OUT/data: the named corpus it was prepared from


@dataclass(frozen=True)
class Corpus:
    """A corpus of ../shared/data: its files, level, its models' Transformer-XL and family (the name the other presets
    extend with a suffix) and default attention lengths."""

    level: str
    train: str
    valid: str | None
    test: str | None
    valid_fraction: float
    xl_preset: str
    family: str
    lengths: tuple[int, ...]


CORPORA = {
    "wikitext-2": Corpus("word", "wikitext-2/wiki.train.tokens.gz", "wikitext-2/wiki.valid.tokens.gz",
                         "wikitext-2/wiki.test.tokens.gz", 0.0, "lm-word-wt2", "lm-word-wt2",
                         (64, 128, 256, 512)),
    "tiny-shakespeare": Corpus("char", "tiny_shakespeare/input.txt.gz", None, None, 0.1, "lm-char-small-xl",
                               "lm-char-small", (128, 256, 512, 1024)),
}


def default_presets(level: str) -> list[str]:
    """The five ablation presets of a word- or character-level corpus."""
    corpus = next((c for c in CORPORA.values() if c.level == level), None)
    if corpus is None:
        raise AttnkitError(f"lm-ablation has no default models for a {level}-level corpus: name them with --models")
    return [corpus.xl_preset] + [corpus.family + suffix for suffix in ABLATION_SUFFIXES]


def prepare_data(data: str, out_dir: Path, corpora_dir: Path, say: Callable[[str], None] = print) -> Path:
    """A prepared LM corpus: `data` itself when it is one, else the named corpus of `corpora_dir`, prepared once
    into OUT/data."""
    if (Path(data) / CORPUS_FILE).is_file():
        return Path(data)
    if data not in CORPORA:
        raise AttnkitError(f"--data {data}: neither a folder written by `attnkit lm prepare` nor one of "
                           f"{', '.join(CORPORA)}")
    target, c = out_dir / "data", CORPORA[data]
    if (target / CORPUS_FILE).is_file():
        _check_prepared_from(target, data)
        return target
    files = [None if name is None else corpora_dir / name for name in (c.train, c.valid, c.test)]
    missing = [str(f) for f in files if f is not None and not f.is_file()]
    if missing:
        raise AttnkitError(f"--data {data}: no {', '.join(missing)} (point --corpora at the shared data folder)")
    say(f"preparing {data} ({c.level} level) in {target}")
    prepare_lm(target, files[0], files[1], files[2], level=c.level, valid_fraction=c.valid_fraction)
    atomic_write_json(target / PREPARED_FROM, {"corpus": data})
    return target


def curve_group(out_dir: Path) -> CurveGroup:
    """The models of a finished `lm-ablation` in `out_dir` as one panel of `attnkit plot crossing`: titled by its
    corpus, its LSTMs the baselines."""
    try:
        summary = json.loads((out_dir / "lm_ablation.json").read_text(encoding="utf-8"))
        models = {m["name"]: m["kind"] for m in summary["models"]}
        level = summary["level"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AttnkitError(f"{out_dir}: no finished lm-ablation here (lm_ablation.json: {e})") from None
    try:
        title = json.loads((out_dir / "data" / PREPARED_FROM).read_text(encoding="utf-8"))["corpus"]
    except (OSError, ValueError, KeyError, TypeError):
        title = out_dir.name
    baselines = tuple(name for name, kind in models.items() if kind == "lstm-lm")
    return CurveGroup(title, level, {name: out_dir / name for name in models}, baselines)


def _check_prepared_from(target: Path, data: str) -> None:
    """OUT/data serves the corpus it was prepared from, never another one named in a later run."""
    try:
        source = json.loads((target / PREPARED_FROM).read_text(encoding="utf-8"))["corpus"]
    except (OSError, ValueError, KeyError, TypeError):  # prepared before the record: its level tells at least
        level = load_lm_corpus(target).vocab.level
        source = data if level == CORPORA[data].level else f"a {level}-level corpus"
    if source != data:
        raise AttnkitError(f"--data {data}: {target} was prepared from {source} by an earlier run; "
                           "choose another --out")


def default_lengths(level: str) -> tuple[int, ...]:
    return next((c.lengths for c in CORPORA.values() if c.level == level), (64, 128, 256, 512))


def default_split(data_dir: Path) -> str:
    """The test split when the corpus has one (WikiText-2), else the validation split (Tiny Shakespeare)."""
    splits = load_lm_corpus(data_dir).splits
    return "test" if "test" in splits else "valid"


# --- training -----------------------------------------------------------------------------------------------------
def resolve_run(preset: str, overrides: Sequence[str]) -> cfgmod.LMRunConfig:
    """The run config one model of the ablation trains with."""
    cfg = cfgmod.resolve([preset], list(overrides), cls=cfgmod.LMRunConfig)
    if cfg.train.schedule == "cosine" and cfg.train.max_minutes and cfg.train.horizon == "steps":
        # one wall-clock budget per model: each one's learning rate decays over it, however fast the model runs
        cfg = cfgmod.resolve([preset], [*overrides, "train.horizon=time"], cls=cfgmod.LMRunConfig)
    return cfg


def train_model(preset: str, cfg: cfgmod.LMRunConfig, data_dir: Path, run_dir: Path, *, identity: dict,
                progress: bool, say: Callable[[str], None]) -> None:
    """Train one model unless it has finished (OUT/<model>/finished.json); a run with a checkpoint resumes. The
    caller has checked that a run in `run_dir` is one of `identity` (`refuse_other_run`)."""
    from attnkit.train.lm_trainer import LMTrainer  # here: evaluating needs no trainer

    if (run_dir / FINISHED).is_file():
        say(f"{run_dir.name}: trained already")
        return
    record_run(run_dir, identity)
    resume = (run_dir / "checkpoints" / "last.safetensors").is_file()
    say(f"{'resuming' if resume else 'training'} {preset} ({cfg.model.kind}, budget {cfg.train.max_minutes or 'none'} "
        f"min, {cfg.train.max_steps or 'no'} step limit) in {run_dir}")
    trainer = LMTrainer(cfg, data_dir, run_dir, resume=resume, progress=progress)
    metrics = trainer.fit()
    atomic_write_json(run_dir / FINISHED, {"step": trainer.state.step, "elapsed_s": trainer.state.elapsed_s,
                                           "valid": metrics})


# --- evaluation ---------------------------------------------------------------------------------------------------
@dataclass
class Evaluation:
    """How every model is scored: the split, the segment T, the streams B and a cap on the tokens (0: all)."""

    split: str
    segment: int
    batch_size: int = 8
    max_tokens: int = 0
    device: str = "auto"


@dataclass
class AblationRow:
    name: str
    kind: str
    positions: str
    recurrence: str
    parameters: int
    steps: int
    train_minutes: float
    carries_memory: bool  # evaluated with its memory carried (else: re-reading the context)
    losses: dict[int, float] = field(default_factory=dict)  # attention length -> mean NLL (nats per token)


def describe(kind: str, mem_len: int) -> tuple[str, str]:
    """(positions, recurrence) of a model kind trained with memory mem_len, as the table names them."""
    positions = {"transformer-xl": "relative", "recurrent-vanilla-lm": "absolute, within segments",
                 "vanilla-lm": "absolute", "lstm-lm": "none (RNN)"}.get(kind, kind)
    if kind == "lstm-lm":
        return positions, "state" if mem_len > 0 else "none"
    return positions, "memory" if mem_len > 0 and kind != "vanilla-lm" else "none"


def best_checkpoint(run_dir: Path) -> Path:
    """The run's best checkpoint, else its last."""
    best, last = run_dir / "checkpoints" / "best.safetensors", run_dir / "checkpoints" / "last.safetensors"
    if not (best.is_file() or last.is_file()):
        raise AttnkitError(f"{run_dir} holds no checkpoint to evaluate")
    return best if best.is_file() else last


def token_losses(run_dir: Path, data_dir: Path, lengths: Sequence[int], ev: Evaluation,
                 say: Callable[[str], None]) -> tuple[AblationRow, dict[int, np.ndarray]]:
    """The model of `run_dir` (its best checkpoint) scored at every attention length: its table row and the
    per-token losses (B, N) per length, read from OUT/<model>/eval/ when this checkpoint was scored before."""
    path = best_checkpoint(run_dir)
    key = evaluation_key(path, data_dir)
    last = run_dir / "checkpoints" / "last.safetensors"
    ckpt = load_checkpoint(last if last.is_file() else path)  # the training position
    device = resolve_device(ev.device)
    model, _, cfg = load_lm_checkpoint(path, device)
    carries = model.attends_to_memory and cfg.train.mem_len > 0
    splits = load_lm_corpus(data_dir).splits
    if ev.split not in splits:
        raise AttnkitError(f"{data_dir} has no {ev.split} split (it has {', '.join(splits)})")
    ids = splits[ev.split]
    out = {}
    for length in lengths:
        t = min(ev.segment, length)
        cache = run_dir / "eval" / f"{ev.split}-L{length}-T{t}-B{ev.batch_size}-N{ev.max_tokens}-{key}.npy"
        if cache.is_file():
            out[length] = np.load(cache)
            continue
        memory, context = (length - t, 0) if carries else (0, length - t)
        scores = evaluate_segments(model, ids, tgt_len=t, mem_len=memory, ext_len=context,
                                   clamp_len=cfg.train.clamp_len, batch_size=ev.batch_size, max_tokens=ev.max_tokens,
                                   device=device, keep_tokens=True)
        out[length] = scores.token_nll.numpy()
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, out[length])
        say(f"{run_dir.name} at attention length {length} ({'memory' if carries else 'context'} {length - t} + "
            f"segment {t}): {scores.summary()}")
    positions, recurrence = describe(model.kind, cfg.train.mem_len)
    row = AblationRow(run_dir.name, model.kind, positions, recurrence, sum(p.numel() for p in model.parameters()),
                      ckpt.train_state.get("step", 0), ckpt.train_state.get("elapsed_s", 0.0) / 60, carries)
    return row, out


def common_tokens(losses: dict[str, dict[int, np.ndarray]]) -> dict[str, dict[int, np.ndarray]]:
    """Every (B, N) array cut to the shortest N, flattened: the same tokens, in the same order, everywhere."""
    n = min(a.shape[1] for by_length in losses.values() for a in by_length.values())
    return {name: {length: a[:, :n].reshape(-1) for length, a in by_length.items()}
            for name, by_length in losses.items()}


# --- the experiment -----------------------------------------------------------------------------------------------
def lm_ablation(presets: Sequence[str], data_dir: Path, out_dir: Path, lengths: Sequence[int], ev: Evaluation, *,
                overrides: Sequence[str] = (), minutes: float | None = None, force: bool = False,
                progress: bool = True, say: Callable[[str], None] = print) -> dict:
    """Train every preset on `data_dir` under the same budget, score each at every attention length, tabulate.
    Models trained before with these settings are reused; other settings are refused unless `force` (train anew)."""
    names = [Path(p).stem for p in presets]
    if len(set(names)) != len(names):
        raise AttnkitError(f"lm-ablation: model names repeat ({', '.join(names)}); each needs its own folder")
    lengths = sorted(set(lengths))
    if not lengths or lengths[0] < 1:
        raise AttnkitError(f"lm-ablation: attention lengths must be positive, not {lengths}")
    if ev.max_tokens and ev.max_tokens // ev.batch_size <= lengths[-1]:
        raise AttnkitError(f"lm-ablation: {ev.max_tokens} tokens over {ev.batch_size} streams are "
                           f"{ev.max_tokens // ev.batch_size} per stream: no token would see an attention length of "
                           f"{lengths[-1]}; score more tokens (--eval-tokens) or fewer streams (--eval-batch-size)")
    budget = [f"train.max_minutes={minutes}"] if minutes is not None else []
    configs = [resolve_run(preset, [*overrides, *budget]) for preset in presets]
    identities = [run_identity(cfg, data_dir) for cfg in configs]
    for name, identity in zip(names, identities):  # every model checked before any trains: a refusal costs no wait
        if force:
            clear_run(out_dir / name)
        refuse_other_run(out_dir / name, identity, "pass --force to train the models again, or choose another --out")
    rows, losses = [], {}
    for preset, name, cfg, identity in zip(presets, names, configs, identities):
        train_model(preset, cfg, data_dir, out_dir / name, identity=identity, progress=progress, say=say)
        row, losses[name] = token_losses(out_dir / name, data_dir, lengths, ev, say)
        rows.append(row)
    tokens = common_tokens(losses)
    for row in rows:
        row.losses = {length: float(tokens[row.name][length].mean()) for length in lengths}
    level = load_lm_corpus(data_dir).vocab.level
    summary = {"level": level, "split": ev.split, "segment": ev.segment, "streams": ev.batch_size,
               "tokens": int(next(iter(next(iter(tokens.values())).values())).size), "lengths": lengths,
               "models": [asdict(r) for r in rows]}
    write_ablation(rows, lengths, level, out_dir, summary)
    return summary


def metric(loss: float, level: str) -> float:
    """Bits per character for a character-level corpus, perplexity otherwise."""
    return float(level_metric(loss, level))


def write_ablation(rows: list[AblationRow], lengths: Sequence[int], level: str, out_dir: Path, summary: dict) -> None:
    name = "bpc" if level == "char" else "ppl"
    header = (["model", "kind", "positions", "recurrence", "parameters", "updates", "train min"]
              + [f"{name} @{length}" for length in lengths] + [f"best {name} (length)"])
    table = []
    for row in rows:
        values = [metric(row.losses[length], level) for length in lengths]
        best = min(range(len(values)), key=values.__getitem__)
        table.append([row.name, row.kind, row.positions, row.recurrence, row.parameters, row.steps,
                      row.train_minutes, *values, f"{cell(values[best])} ({lengths[best]})"])
    write_table(out_dir, "lm_ablation", header, table)
    atomic_write_json(out_dir / "lm_ablation.json", summary)
    plot_ablation(rows, lengths, level, out_dir / "lm_ablation.png")


def plot_ablation(rows: list[AblationRow], lengths: Sequence[int], level: str, path: Path) -> None:
    """One line per model: perplexity (bpc) against the attention length at evaluation."""
    fig, axes = subplots(1, 1, 6.0, 3.8)
    ax = axes[0, 0]
    for row in rows:
        ax.plot(lengths, [metric(row.losses[length], level) for length in lengths], marker="o", label=row.name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(lengths), [str(length) for length in lengths])
    ax.set_xlabel("attention length at evaluation (memory or context + segment)")
    ax.set_ylabel("bits per character" if level == "char" else "perplexity")
    ax.set_title("recurrence x positional encoding")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    finish(fig, {}, path, dpi=110)
