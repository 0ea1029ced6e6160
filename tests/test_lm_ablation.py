"""The LM ablation (`attnkit experiment lm-ablation`): the recurrent vanilla LM (absolute positions counted within
each segment, with Transformer-XL's memory), the LSTM LM behind the same interface, per-token losses, the
experiment end to end on a tiny corpus, and `attnkit lm speed --vanilla-tokens`."""

from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pytest
import torch

from attnkit import config as cfgmod
from attnkit.cli.main import main
from attnkit.config import RNNLMConfig, TransformerXLConfig
from attnkit.data.lm import load_lm_corpus
from attnkit.eval.lm import evaluate_segments
from attnkit.experiments.lm_ablation import default_presets
from attnkit.models import build_model
from attnkit.nn import causal_mask

pytestmark = pytest.mark.usefixtures("one_thread")
V = 13


def tiny(kind: str, **kw):
    torch.manual_seed(0)
    base = dict(vocab_size=V, d_model=16, n_layers=2, dropout=0.0)
    if kind == "lstm-lm":
        cfg = RNNLMConfig(**{**base, **kw})
    else:
        cfg = TransformerXLConfig(kind=kind, **{**base, "n_heads": 2, "d_ff": 32, **kw})
    return build_model(kind, cfg).double().eval()


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))


# --- absolute positions with recurrence ----------------------------------------------------------------------------
def test_absolute_positions_with_recurrence_count_positions_within_the_segment():
    model = tiny("recurrent-vanilla-lm")
    added = []
    model.positions.register_forward_hook(lambda mod, args, out: added.append(out - args[0]))  # what PE added
    first, second = tokens(2, 6, seed=1), tokens(2, 6, seed=2)
    _, mems = model(first, mem_len=6)
    with_memory, _ = model(second, mems, mem_len=6)
    torch.testing.assert_close(added[1], added[0])  # segment 2 gets positions 0..5 again, as segment 1 did
    torch.testing.assert_close(added[0][0], model.positions.table[:6].double())
    alone, _ = model(second)
    assert not torch.allclose(with_memory, alone)  # the memory is read ...
    assert [m.shape for m in mems] == [(2, 6, 16)] * 2 and not any(m.requires_grad for m in mems)


def test_a_segment_over_its_memory_equals_one_pass_with_positions_restarting():
    """Two segments: the second over the first's memory equals one causal pass over both, whose positions are
    0..T-1 twice (the first segment has no memory, so its states are those of the full pass)."""
    model = tiny("recurrent-vanilla-lm", n_layers=3)
    first, second = tokens(2, 5, seed=3), tokens(2, 5, seed=4)
    _, mems = model(first, mem_len=5)
    ours, _ = model(second, mems, mem_len=5)
    both = torch.cat([first, second], dim=1)  # (2, 10)
    h = model.embed_tokens(both) + model.positions.table[torch.arange(10) % 5].double()
    for layer in model.layers:
        h, _ = layer(h, mask=causal_mask(10))
    torch.testing.assert_close(ours, model.output(h)[:, 5:])


def test_the_recurrent_vanilla_lm_is_the_vanilla_lm_without_memory():
    ours, vanilla = tiny("recurrent-vanilla-lm"), tiny("vanilla-lm")
    assert ours.state_dict().keys() == vanilla.state_dict().keys()
    vanilla.load_state_dict(ours.state_dict())
    x = tokens(2, 7)
    torch.testing.assert_close(ours(x)[0], vanilla(x)[0])
    _, mems = ours(x, mem_len=4)
    assert [m.size(1) for m in mems] == [4, 4]  # the last mem_len layer inputs, as Transformer-XL keeps them


# --- the LSTM LM ---------------------------------------------------------------------------------------------------
def test_lstm_lm_carries_its_state_only_with_memory():
    model = tiny("lstm-lm")
    x = tokens(3, 12)
    whole, _ = model(x)
    first, mems = model(x[:, :5], mem_len=1)
    rest, _ = model(x[:, 5:], mems, mem_len=1)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), whole)  # state carried: the same as one pass
    assert [m.shape for m in mems] == [(2, 3, 16)] * 2  # [h, c], (L, B, D)
    assert model(x[:, :5], mem_len=0)[1] == []
    nll, _ = model(x, targets=x[:, -4:])
    assert nll.shape == (3, 4)


def test_lstm_state_before_the_extended_context_is_carried():
    model = tiny("lstm-lm")
    x = tokens(2, 10)
    _, with_ext = model(x, mem_len=1, ext_len=3)
    _, upto = model(x[:, :7], mem_len=1)
    for a, b in zip(with_ext, upto):
        torch.testing.assert_close(a, b)


def test_per_token_losses_line_up_with_the_total():
    model = tiny("transformer-xl").float()
    ids = tokens(200, seed=5)
    scores = evaluate_segments(model, ids, tgt_len=8, mem_len=8, batch_size=4, keep_tokens=True)
    assert scores.token_nll.shape == (4, 49)  # 4 streams of 50 tokens: 49 predictions each
    assert scores.token_nll.sum().item() == pytest.approx(scores.nll, rel=1e-5) and scores.tokens == 196
    window = evaluate_segments(model, ids, tgt_len=8, ext_len=8, batch_size=4, keep_tokens=True)
    assert window.token_nll.shape == scores.token_nll.shape  # re-reading 8 tokens of context: the same tokens


def test_lm_run_configs_name_the_lm_families():
    cfg = cfgmod.resolve(["lm-char-small-lstm"])
    assert isinstance(cfg, cfgmod.LMRunConfig) and isinstance(cfg.model, RNNLMConfig)
    for level in ("char", "word"):  # the default models: the XL, then each ablation's kind, every preset resolvable
        kinds = [cfgmod.resolve([name]).model.kind for name in default_presets(level)]
        assert kinds == ["transformer-xl", "transformer-xl", "recurrent-vanilla-lm", "vanilla-lm", "lstm-lm"]
    with pytest.raises(cfgmod.ConfigError, match="not a language model"):
        cfgmod.resolve([], ["model.kind=transformer"], cls=cfgmod.LMRunConfig)
    with pytest.raises(cfgmod.ConfigError, match="model.kind must be one of"):
        TransformerXLConfig(kind="lstm-lm")


# --- the experiment end to end -------------------------------------------------------------------------------------
TINY = ["--model.d_model=16", "--train.batch_size=4", "--train.eval_batch_size=2", "--train.device=cpu",
        "--train.eval_interval=3", "--train.log_every=1", "--train.max_steps=3", "--train.warmup=1",
        "--train.eval_max_tokens=64", "--train.dtype=float32"]
TEXT = "".join(f"{who}: the {what} is {how}.\n" for who in ("ANNA", "BEN", "CARL") for what in ("cat", "sea", "king")
               for how in ("here", "gone", "old", "new")) * 4


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    (root / "tiny_shakespeare").mkdir()
    with gzip.open(root / "tiny_shakespeare" / "input.txt.gz", "wt", encoding="utf-8") as f:
        f.write(TEXT)
    return root


@pytest.fixture(scope="module")
def ablation(tmp_path_factory, corpora):
    out = tmp_path_factory.mktemp("ablation") / "run"
    models = []
    for suffix in ("", "-no-recurrence", "-absolute", "-vanilla", "-lstm"):  # the presets, at a tiny size
        overrides = "" if suffix == "-lstm" else "  n_heads: 2\n  d_ff: 32\n  n_layers: 1\n"
        path = out.parent / f"m{suffix or '-xl'}.yaml"
        path.write_text(f"base: lm-char-small{suffix or '-xl'}\nmodel:\n{overrides or '  n_layers: 1'}\n")
        models.append(str(path))
    argv = ["experiment", "lm-ablation", "--data", "tiny-shakespeare", "--corpora", str(corpora), "--out", str(out),
            "--models", *models, "--minutes-per-model", "5", "--lengths", "8", "16", "32", "--segment", "8",
            "--eval-batch-size", "2", "--eval-tokens", "120", "--quiet", "--device", "cpu", *TINY]
    assert main(argv) == 0
    return out, argv, models


def test_lm_ablation_trains_scores_and_tabulates_every_model(ablation):
    out, _, models = ablation
    with open(out / "lm_ablation.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["kind"] for r in rows] == ["transformer-xl", "transformer-xl", "recurrent-vanilla-lm", "vanilla-lm",
                                         "lstm-lm"]
    assert [r["recurrence"] for r in rows] == ["memory", "none", "memory", "none", "state"]
    assert all(float(r[f"bpc @{n}"]) > 0 for r in rows for n in (8, 16, 32))
    assert all(int(r["updates"]) == 3 for r in rows)
    assert not any(key.startswith("RECL") for key in rows[0])  # RECL is `experiment recl`'s, with exact contexts
    summary = json.loads((out / "lm_ablation.json").read_text())
    assert summary["split"] == "valid" and summary["lengths"] == [8, 16, 32] and summary["streams"] == 2
    first = summary["models"][0]
    (cached,) = (out / "m-xl" / "eval").glob("valid-L32-T8-B2-N120-*.npy")  # named by the checkpoint it scored
    losses = np.load(cached)
    assert first["losses"]["32"] == pytest.approx(float(losses[:, :summary["tokens"] // 2].mean()), rel=1e-6)
    assert (out / "lm_ablation.png").read_bytes()[:4] == b"\x89PNG"
    config = cfgmod.resolve([models[0]], [t.removeprefix("--") for t in TINY], cls=cfgmod.LMRunConfig)
    assert load_lm_corpus(out / "data").vocab.level == "char" and config.train.max_steps == 3


def test_lm_ablation_resumes_without_training_or_scoring_again(ablation, capsys):
    out, argv, _ = ablation
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.safetensors")}
    before.update({p: p.stat().st_mtime_ns for p in out.rglob("*.npy")})
    capsys.readouterr()
    assert main(argv) == 0
    assert "trained already" in capsys.readouterr().out
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())


def test_lm_speed_times_the_vanilla_window_over_its_own_token_count(capsys):
    code = main(["lm", "speed", "--lengths", "16", "60", "--runs", "1", "--vanilla-tokens", "2", "--model.d_model=16",
                 "--model.n_heads=2", "--model.d_ff=32", "--model.n_layers=1"])
    out = capsys.readouterr().out
    assert code == 0 and "vanilla over 2 tokens, XL over 1 segments" in out
    assert "| 60 | 15 + 45 |" in out


def test_lm_ablation_refuses_a_token_cap_shorter_than_the_longest_attention_length(ablation, capsys):
    _, argv, _ = ablation
    capsys.readouterr()
    argv = [*argv[: argv.index("--eval-tokens") + 1], "40", *argv[argv.index("--eval-tokens") + 2 :]]
    assert main(argv) == 2
    assert "20 per stream" in capsys.readouterr().err
