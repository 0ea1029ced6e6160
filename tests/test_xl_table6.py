"""Transformer-XL's claims measured as the paper measures them: same_length against a naive sliding window, the
reference-style recompute beside the cached keys (`attnkit lm speed --recompute`), the equal-parameter presets, and
`attnkit experiment xl-table6` and `attnkit experiment recl` end to end on a tiny corpus (equal updates, choices on
one half of the validation text and figures on the other, the vanilla model capped at its training length, RECL on
a uniform grid with exact contexts)."""

from __future__ import annotations

import csv
import gzip
import json
import random

import pytest
import torch

from attnkit import config as cfgmod
from attnkit.cli.main import main
from attnkit.config import TransformerXLConfig
from attnkit.eval.lm import evaluate_segments, evaluate_windows
from attnkit.experiments.xl_table6 import equal_updates_config, table6_presets, with_same_length
from attnkit.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
V = 11


def tiny(**kw):
    torch.manual_seed(0)
    base = dict(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0)
    return build_model("transformer-xl", TransformerXLConfig(**{**base, **kw})).double().eval()


# --- same_length, as the reference evaluates ----------------------------------------------------------------------
@pytest.mark.parametrize("clamp", [0, 5])
def test_same_length_segments_over_a_memory_are_a_sliding_window_of_mem_len(clamp):
    """One layer, same_length, memory L: every query attends to exactly the L positions ending at itself, so each
    token's loss is the model's on the window of the L tokens before it, read alone (a naive sliding window)."""
    model = with_same_length(tiny())
    assert model.config.same_length and not tiny().config.same_length
    ids = torch.randint(V, (90,), generator=torch.Generator().manual_seed(2))
    length = 12
    streamed = evaluate_segments(model, ids, tgt_len=5, mem_len=length, clamp_len=clamp, keep_tokens=True)
    positions = list(range(length, 90))
    windows = evaluate_windows(tiny(), ids, positions, context=length, clamp_len=clamp)
    torch.testing.assert_close(streamed.token_nll[0, length - 1 :], windows)  # column j predicts token j + 1
    plain = evaluate_segments(tiny(), ids, tgt_len=5, mem_len=length, clamp_len=clamp, keep_tokens=True)
    assert not torch.allclose(plain.token_nll[0, length - 1 :], windows)  # without it a query sees up to L + T - 1


def test_with_same_length_keeps_the_weights():
    model = tiny(n_layers=2)
    copy = with_same_length(model)
    assert copy is not model and all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                                        copy.state_dict().values()))


# --- the reference's recompute ------------------------------------------------------------------------------------
def test_recomputing_the_memory_keys_and_position_keys_gives_the_same_result_and_really_recomputes():
    model = tiny(n_layers=2)
    x = torch.randint(V, (2, 15), generator=torch.Generator().manual_seed(4))
    calls = []
    model.layers[0].attn.pos_proj.register_forward_hook(lambda mod, args, out: calls.append(args[0].size(0)))
    projected, attn = [], model.layers[1].attn
    project_kv = attn.project_kv
    attn.project_kv = lambda h: (projected.append(h.size(1)), project_kv(h))[1]  # positions given keys/values

    def read(reuse_keys: bool) -> torch.Tensor:
        mems, parts = None, []
        with torch.no_grad():
            for start in range(0, 15, 5):
                logits, mems = model(x[:, start : start + 5], mems, mem_len=5, reuse_keys=reuse_keys)
                parts.append(logits)
        return torch.cat(parts, 1)

    cached = read(True)
    cached_calls, cached_projected = list(calls), list(projected)
    calls.clear()
    projected.clear()
    torch.testing.assert_close(read(False), cached)
    assert calls == [5, 10, 10] and cached_calls == [5, 10]  # position keys: every segment, or once per length
    assert sorted(projected) == [5, 5, 5, 5, 5] and sorted(cached_projected) == [5, 5, 5]  # the memory's 5, again


def test_lm_speed_times_the_reference_recompute_beside_the_cached_keys(capsys):
    code = main(["lm", "speed", "--lengths", "16", "32", "--runs", "1", "--recompute", "--model.d_model=16",
                 "--model.n_heads=2", "--model.d_ff=32", "--model.n_layers=1"])
    out = capsys.readouterr().out
    assert code == 0 and "recomputed as the XL reference does" in out
    assert "| XL ms/token | speed-up | XL ms/token, recomputed | speed-up, recomputed |" in out
    assert out.count("| 32 | 8 + 24 |") == 1 and all(line.count("|") == 9 for line in out.splitlines()[2:])


# --- the presets --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level,vocab", [("word", 33278), ("char", 66)])
def test_the_equal_parameter_presets_have_the_xls_parameter_count(level, vocab):
    """The groups of the paper's RECL are of equal parameter count: the vanilla Transformer and the LSTM within 1%
    of the corpus's Transformer-XL (WikiText-2's 33,278 words, Tiny Shakespeare's 65 characters and <unk>)."""
    counts = {}
    for preset in table6_presets(level):
        cfg = cfgmod.resolve([preset], [f"model.vocab_size={vocab}"], cls=cfgmod.LMRunConfig)
        counts[preset] = sum(p.numel() for p in build_model(cfg.model.kind, cfg.model).parameters())
    xl = counts[table6_presets(level)[0]]
    for preset in table6_presets(level):
        if preset.endswith(("-vanilla-64", "-lstm-matched", "-no-recurrence-64")):
            assert abs(counts[preset] / xl - 1) < 0.01, (preset, counts[preset], xl)
        cfg = equal_updates_config(preset, 123, [])
        assert (cfg.train.max_steps, cfg.train.max_minutes, cfg.train.horizon) == (123, 0.0, "steps")
        assert cfg.train.tgt_len == (128 if preset.endswith("-no-recurrence") else 64)  # one backprop length


# --- the experiments end to end -----------------------------------------------------------------------------------
def corpus_text(n_lines: int = 700) -> str:
    rng = random.Random(1)
    words = ["the", "king", "is", "dead", "long", "live", "my", "lord", "sea", "and", "old"]
    return "".join(f"{rng.choice(['ANNA', 'BEN'])}: {' '.join(rng.choice(words) for _ in range(5))}.\n"
                   for _ in range(n_lines))


@pytest.fixture(scope="module")
def table6(tmp_path_factory):
    root = tmp_path_factory.mktemp("table6")
    (root / "corpora" / "tiny_shakespeare").mkdir(parents=True)
    with gzip.open(root / "corpora" / "tiny_shakespeare" / "input.txt.gz", "wt", encoding="utf-8") as f:
        f.write(corpus_text())
    models = []
    for preset in table6_presets("char"):
        path = root / f"{preset.removeprefix('lm-char-small-')}.yaml"
        size = "  d_model: 16\n" + ("" if "lstm" in preset else "  n_heads: 2\n  d_ff: 32\n  n_layers: 1\n")
        path.write_text(f"base: {preset}\nmodel:\n{size}")
        models.append(str(path))
    out = root / "out"
    common = ["--data", "tiny-shakespeare", "--corpora", str(root / "corpora"), "--out", str(out), "--updates", "4",
              "--quiet", "--device", "cpu", "--train.batch_size=4", "--train.eval_max_tokens=128",
              "--train.dtype=float32", "--train.log_every=1", "--train.warmup=1", "--train.eval_batch_size=2"]
    argv = ["experiment", "xl-table6", *common, "--models", *models, "--lengths", "32", "64", "256",
            "--eval-batch-size", "2", "--eval-tokens", "1200"]
    assert main(argv) == 0
    return out, common, models


def test_xl_table6_trains_equal_updates_and_reports_both_columns(table6):
    out, _, _ = table6
    summary = json.loads((out / "xl_table6.json").read_text())
    assert summary["chosen_on"] == "valid-first-half" and summary["reported_on"] == "valid-second-half"
    rows = {m["name"]: m for m in summary["models"]}
    assert [m["updates"] for m in summary["models"]] == [4] * 6
    assert [m["segment"] for m in summary["models"]] == [64, 64, 128, 64, 64, 64]
    xl, norec, vanilla, lstm = rows["xl"], rows["no-recurrence-64"], rows["vanilla-64"], rows["lstm-matched"]
    assert xl["train_length"] == 128 and norec["train_length"] == 64 and vanilla["train_length"] == 64
    # relative positions: every length, with a clamp at the training length where it matters (L > 128)
    assert set(xl["selection"]) == {"32/0", "64/0", "128/0", "256/0", "256/128"}
    assert set(vanilla["selection"]) == {"32/0", "64/0"}  # absolute positions: never beyond the training length
    assert lstm["selection"] == {} and lstm["best"] == "state" and lstm["at_best"] == lstm["at_train"]  # no choice
    for row in summary["models"][:5]:
        assert row["best"] == min(row["selection"], key=row["selection"].get)  # chosen on the first half
        assert row["at_best"] > 0 and row["at_train"] > 0 and row["tok_s"] > 0
    with open(out / "xl_table6.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["model"] for r in table] == ["xl", "no-recurrence-64", "no-recurrence", "absolute", "vanilla-64",
                                           "lstm-matched"]
    assert {"bpc @training length", "bpc @best", "best length", "train tok/s"} <= set(table[0])
    assert (out / "xl_table6.png").read_bytes()[:4] == b"\x89PNG"


def test_recl_reuses_the_models_and_follows_appendix_c(table6, capsys):
    out, common, models = table6
    by_name = {m.rsplit("/", 1)[-1].removesuffix(".yaml"): m for m in models}
    capsys.readouterr()
    argv = ["experiment", "recl", *common, "--group", "rnn", by_name["xl"], by_name["lstm-matched"],
            "--group", "transformer", by_name["xl"], by_name["no-recurrence-64"], by_name["vanilla-64"],
            "--delta", "32", "--longest", "128", "--tokens", "40"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("trained already") == 4  # the models xl-table6 trained: the same settings and data
    summary = json.loads((out / "recl.json").read_text())
    assert summary["contexts"] == [32, 64, 96, 128] and summary["tokens"] == 40
    assert set(summary["results"]["rnn"]) == {"r=0.1", "r=0.5", "r=1"}
    assert summary["models"]["vanilla-64"]["longest_context"] == 64  # capped at its training length
    gains = summary["results"]["transformer"]["r=0.5"]["gains"]
    assert [step[1] for step in gains["vanilla-64"]] == [64] and [step[1] for step in gains["xl"]] == [64, 96, 128]
    for result in summary["results"]["transformer"].values():
        assert result["recl"]["vanilla-64"] <= 64
    (cached,) = (out / "xl" / "eval").glob("recl-valid-C96-K40-*.npy")  # 40 tokens, each with exactly 96 before it
    assert cached.stat().st_size > 0
    with open(out / "recl.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["group"], r["model"]) for r in table] == [("rnn", "xl"), ("rnn", "lstm-matched"), ("transformer", "xl"),
                                                        ("transformer", "no-recurrence-64"),
                                                        ("transformer", "vanilla-64")]
    assert (out / "recl.png").read_bytes()[:4] == b"\x89PNG"
