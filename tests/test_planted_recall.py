"""Planted long-range recall (attnkit.data.planted, attnkit.eval.recall, `attnkit experiment planted-recall`): the
keys stand exactly where the scorer looks and nowhere else, the scorer reads only the recalled key tokens, a model
that copies scores perfect recall within its reach and chance beyond, a uniform one chance, and the experiment runs
end to end on a tiny corpus."""

from __future__ import annotations

import csv
import gzip
import json
import math
import random
import string

import numpy as np
import pytest
import torch
from torch import nn

from attnkit.cli.main import main
from attnkit.config import TransformerXLConfig
from attnkit.data.lm import LMStreams
from attnkit.data.planted import cut_rows, plant
from attnkit.errors import AttnkitError
from attnkit.eval.lm import stream_log_probs, window_log_probs
from attnkit.eval.recall import chance_loss, recall_scores, token_scores
from attnkit.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
V, MARKER, FILLER, POOL = 30, 1, 2, list(range(5, 15))


def text(n: int = 3000, seed: int = 0) -> np.ndarray:
    """Natural tokens 3 .. 29, with the marker among them now and then (planting must remove it)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, V, n)
    ids[rng.choice(n, 20, replace=False)] = MARKER
    return ids


def planted(**kw):
    args = dict(marker=MARKER, filler=FILLER, key_pool=POOL, key_len=3, distances=(10, 30, 60), rows=3, gap=(2, 5),
                seed=0)
    return plant(text(), **{**args, **kw})


# --- planting -----------------------------------------------------------------------------------------------------
def test_keys_stand_exactly_where_the_planting_says_and_nothing_else_changes():
    original = cut_rows(text(), 3)
    p = planted()
    q = p.key_len
    expected_markers = set()
    touched = np.zeros_like(p.ids, dtype=bool)
    for b, a, d, key in zip(p.row, p.marker_at, p.distance, p.keys):
        for start in (a, a + d):
            expected_markers.add((b, start))
            assert p.ids[b, start + 1 : start + 1 + q].tolist() == key.tolist()  # the key after both markers
            touched[b, start : start + 1 + q] = True
    assert set(zip(*np.nonzero(p.ids == MARKER))) == expected_markers  # the marker only where planted
    natural_markers = (original == MARKER) & ~touched
    assert natural_markers.any() and (p.ids[natural_markers] == FILLER).all()  # overwritten by the filler
    untouched = ~touched & ~natural_markers
    assert (p.ids[untouched] == original[untouched]).all()  # the rest of the text as it was
    row, col, token, distance = p.recalled()  # what the scorer reads: the tokens after the second marker
    assert (p.ids[row, col] == token).all() and (p.ids[row, col - distance] == token).all()
    assert (p.ids[row, col - (col - p.marker_at.repeat(q) - distance)] == MARKER).all()
    assert col.size == p.row.size * q and set(token.tolist()) <= set(POOL)


def test_the_planting_is_seeded_and_cycles_through_the_distances():
    p, again, other = planted(), planted(), planted(seed=1)
    assert (p.ids == again.ids).all() and (p.keys == again.keys).all()
    assert not np.array_equal(p.keys[:5], other.keys[:5])
    assert p.distance[:6].tolist() == [10, 30, 60, 10, 30, 60]
    drawn = planted(order="random", distances=range(10, 61))
    assert len(set(drawn.distance.tolist())) > 10 and drawn.distance.min() >= 10 and drawn.distance.max() <= 60
    assert (planted(lead=40).marker_at[np.r_[0, np.nonzero(np.diff(planted(lead=40).row))[0] + 1]] >= 42).all()


def test_pairs_stay_inside_their_row_and_lmstreams_reads_the_rows_back():
    p = planted()
    assert ((p.marker_at + p.distance + p.key_len) < p.ids.shape[1]).all()
    streams = LMStreams(torch.from_numpy(p.flat()), 3, 8)
    assert torch.equal(streams.data, torch.from_numpy(p.ids))


def test_the_planting_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="exceed the key length"):
        planted(distances=(3, 30))
    with pytest.raises(ValueError, match="key pool"):
        planted(key_pool=[MARKER, 5])
    with pytest.raises(ValueError, match="cycle or random"):
        planted(order="shuffled")


# --- scoring ------------------------------------------------------------------------------------------------------
def test_perfect_recall_scores_zero_and_uniform_predictions_score_chance():
    p = planted()
    _, _, token, _ = p.recalled()
    one_hot = torch.full((token.size, V), -1e9)
    one_hot[torch.arange(token.size), torch.from_numpy(token)] = 0.0
    perfect = recall_scores(p, token_scores(one_hot, torch.from_numpy(token)))
    assert [r.distance for r in perfect] == [10, 30, 60]
    assert all(r.loss == pytest.approx(0.0) and r.accuracy == 1.0 and r.whole_keys == 1.0 for r in perfect)
    assert sum(r.tokens for r in perfect) == token.size and sum(r.keys for r in perfect) == p.row.size
    uniform = recall_scores(p, token_scores(torch.full((token.size, V), -math.log(V)), torch.from_numpy(token)))
    assert all(r.loss == pytest.approx(math.log(V)) and r.accuracy == 0.0 for r in uniform)  # a tie is no recall
    over_pool = torch.full((token.size, V), -1e9)
    over_pool[:, POOL] = -math.log(len(POOL))
    chance = recall_scores(p, token_scores(over_pool, torch.from_numpy(token)))
    assert all(r.loss == pytest.approx(chance_loss(len(POOL))) for r in chance)
    with pytest.raises(ValueError, match="recalled key tokens"):
        recall_scores(p, np.zeros((3, 2)))


def test_stream_and_window_log_probs_are_the_models_at_the_chosen_positions():
    torch.manual_seed(0)
    model = build_model("transformer-xl", TransformerXLConfig(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                                                              dropout=0.0)).double().eval()
    rows = torch.randint(V, (2, 40), generator=torch.Generator().manual_seed(1))
    row, col = [0, 1, 1, 0], [5, 17, 39, 24]
    full = model(rows)[0].log_softmax(-1)  # (2, 40, V): the whole rows at once
    ours = stream_log_probs(model, rows, row, col, tgt_len=8, mem_len=40)  # a memory that keeps everything
    torch.testing.assert_close(ours, full[row, [c - 1 for c in col]].float())
    scored = stream_log_probs(model, rows, row, col, tgt_len=8, mem_len=40, reduce=token_scores)
    torch.testing.assert_close(scored[:, 0], -full[row, [c - 1 for c in col], rows[row, col]].float())
    flat = rows.reshape(-1)
    windows = window_log_probs(model, flat, [b * 40 + c for b, c in zip(row, col)], context=5)
    for k, (b, c) in enumerate(zip(row, col)):
        alone = model(flat[None, b * 40 + c - 5 : b * 40 + c])[0][0, -1].log_softmax(-1)
        torch.testing.assert_close(windows[k], alone.float())


class CopyLM(nn.Module):
    """Copies keys: after a marker (and the key tokens since), it predicts the token that followed the marker before,
    if that one is among its last `reach` tokens; otherwise every token is equally likely. Its memory is the ids it
    read (the last `reach`), carried with mem_len > 0, as a memory of positions."""

    kind = "copy-lm"
    attends_to_memory = True

    def __init__(self, reach: int, key_len: int):
        super().__init__()
        self.reach, self.key_len = reach, key_len
        self.dummy = nn.Parameter(torch.zeros(1))

    def predict(self, seen: list[int]) -> torch.Tensor:
        out = torch.full((V,), -math.log(V))
        markers = [i for i, t in enumerate(seen) if t == MARKER]
        if len(markers) >= 2 and len(seen) - 1 - markers[-1] < self.key_len:
            source = markers[-2] + len(seen) - markers[-1]
            out = torch.full((V,), -1e9)
            out[seen[source]] = 0.0
        return out

    def forward(self, x, mems=None, *, targets=None, mem_len=0, clamp_len=0, ext_len=0, need_weights=False):
        history = mems[0] if mems else x[:, :0]
        both = torch.cat([history, x], dim=1)
        m = history.size(1)
        logits = torch.stack([torch.stack([self.predict(both[b, max(0, m + i + 1 - self.reach) : m + i + 1].tolist())
                                           for i in range(x.size(1))]) for b in range(x.size(0))])  # (B, T, V)
        new = [both[:, -self.reach :]] if mem_len > 0 else []
        if targets is not None:
            logits = logits[:, -targets.size(1) :]
            return -logits.gather(2, targets[..., None])[..., 0], new
        return logits, new


def test_a_copying_model_recalls_perfectly_within_its_reach_and_is_at_chance_beyond():
    p = plant(text(4000), marker=MARKER, filler=FILLER, key_pool=POOL, key_len=3, distances=(10, 30, 80, 120),
              rows=2, gap=(2, 5), lead=60, seed=0)
    row, col, _, _ = p.recalled()
    copy = CopyLM(reach=60, key_len=3)  # the first marker within 60 tokens: D + 2 < 60
    streamed = recall_scores(p, stream_log_probs(copy, torch.from_numpy(p.ids), row, col, tgt_len=16, mem_len=1,
                                                 reduce=token_scores))
    flat = (row * p.ids.shape[1] + col).tolist()
    windowed = recall_scores(p, window_log_probs(copy, torch.from_numpy(p.flat()), flat, context=60,
                                                 reduce=token_scores))
    for rows in (streamed, windowed):
        by_d = {r.distance: r for r in rows}
        assert by_d[10].accuracy == by_d[30].accuracy == 1.0 and by_d[10].loss == pytest.approx(0.0)
        assert by_d[80].accuracy == by_d[120].accuracy == 0.0 and by_d[120].loss == pytest.approx(math.log(V))


# --- the experiment end to end ------------------------------------------------------------------------------------
def shakespeare_like(n_lines: int = 1500) -> str:
    rng = random.Random(0)
    words = ["the", "king", "is", "dead", "long", "live", "my", "lord", "sea", "and", "old", "new", "here", "gone"]
    return "".join(f"{rng.choice(['ANNA', 'BEN'])}: {' '.join(rng.choice(words) for _ in range(6))}.\n"
                   for _ in range(n_lines))


def test_planted_recall_trains_equal_updates_and_scores_recall_by_distance(tmp_path, capsys):
    corpora = tmp_path / "corpora"
    (corpora / "tiny_shakespeare").mkdir(parents=True)
    with gzip.open(corpora / "tiny_shakespeare" / "input.txt.gz", "wt", encoding="utf-8") as f:
        f.write(shakespeare_like())
    models = []
    for preset in ("lm-char-small-xl", "lm-char-small-no-recurrence-64", "lm-char-small-vanilla-64",
                   "lm-char-small-lstm-matched"):
        path = tmp_path / f"{preset.removeprefix('lm-char-small-')}.yaml"
        size = "  d_model: 16\n" + ("" if "lstm" in preset else "  n_heads: 2\n  d_ff: 32\n  n_layers: 1\n")
        path.write_text(f"base: {preset}\nmodel:\n{size}")
        models.append(str(path))
    out = tmp_path / "out"
    argv = ["experiment", "planted-recall", "--data", "tiny-shakespeare", "--corpora", str(corpora), "--out", str(out),
            "--models", *models, "--updates", "3", "--distances", "24", "96", "--eval-batch-size", "2", "--quiet",
            "--train-distances", "24", "200", "--train-spacing", "log", "--gap", "8", "32",
            "--device", "cpu", "--train.batch_size=4", "--train.eval_max_tokens=256", "--train.dtype=float32",
            "--train.log_every=1", "--train.warmup=1"]
    assert main(argv) == 0
    summary = json.loads((out / "planted_recall.json").read_text())
    assert summary["split"] == "valid"  # Tiny Shakespeare has no test split
    assert main([*argv, "--split", "test"]) != 0  # the models above are reused: nothing trains again
    assert "has no test split" in capsys.readouterr().err
    letters = len(set(shakespeare_like()) & set(string.ascii_lowercase))
    assert summary["marker_token"] == "<unk>" and summary["key_pool"] == letters  # never in the text; its letters
    assert summary["chance_loss"] == pytest.approx(math.log(letters))
    assert [m["updates"] for m in summary["models"]] == [3, 3, 3, 3]
    readings = [m["reading"] for m in summary["models"]]
    assert readings[0].startswith("streams") and readings[3].startswith("streams") and readings[1] == "window of 64"
    for m in summary["models"]:
        assert [r["distance"] for r in m["rows"]] == [24, 96] and all(r["tokens"] == 6 * r["keys"] for r in m["rows"])
    with open(out / "planted_recall.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 8
    assert (out / "planted_recall.png").read_bytes()[:4] == b"\x89PNG"
    recorded = json.loads((out / "planted" / "data" / "planting.json").read_text())
    assert (out / "planted" / "xl" / "finished.json").is_file()
    assert recorded["pairs"]["valid"] > 0 and recorded["planting"]["distances"] == [24, 96]
    assert recorded["planting"]["train_distances"] == [24, 200] and recorded["planting"]["train_spacing"] == "log"
    assert recorded["planting"]["gap"] == [8, 32]


def test_log_spaced_training_distances_put_as_many_pairs_below_the_geometric_mean_as_above():
    from attnkit.experiments.planted_recall import Planting, training_distances

    assert training_distances(Planting(key_len=3, train_distances=(24, 768))) == list(range(24, 769))
    log = training_distances(Planting(key_len=3, train_distances=(24, 768), train_spacing="log"))
    assert log[0] == 24 and log[-1] == 768 and len(log) == len(set(log)) > 50
    middle = math.sqrt(24 * 768)
    assert abs(sum(d < middle for d in log) - sum(d > middle for d in log)) <= 2
    with pytest.raises(AttnkitError, match="uniform or log"):
        training_distances(Planting(key_len=3, train_spacing="square"))
