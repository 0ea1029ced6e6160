"""Kyubyong Park's Transformer as a variant (`model.variant: kyubyong`, docs/kyubyong.md): each of its four
differences changes exactly what it names, the default stays the paper's (and checkpoints written with the older
switches load as the variant), the presets and batches of N sentences."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnkit import checkpoint as ckptmod
from attnkit import config as cfgmod
from attnkit.cli.main import main
from attnkit.config import PAD_ID, TransformerConfig
from attnkit.data import TokenBatchSampler
from attnkit.models import build_model
from attnkit.nn import ConcatHeadsAttention, MultiHeadAttention, scaled_dot_product
from attnkit.train.schedules import make_schedule
from conftest import tiny_model_config

pytestmark = pytest.mark.usefixtures("one_thread")
# the switches older versions wrote for his model, which a checkpoint of theirs still carries
OLD_SWITCHES = {"output_projection": False, "sublayer_dropout": False, "layer_norm_eps": 1e-8,
                "zero_pad_positions": True}


def model(**kw):
    torch.manual_seed(0)
    return build_model("transformer", tiny_model_config(**kw)).double().eval()


def ids(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 40, shape, generator=torch.Generator().manual_seed(seed))


def padded_source() -> torch.Tensor:
    return torch.cat([ids(1, 7), torch.cat([ids(1, 4, seed=5), torch.full((1, 3), PAD_ID)], 1)])  # (2, 7)


# --- no W^O -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("need_weights", [True, False])
def test_without_w_o_the_attention_output_is_the_concatenated_heads(need_weights):
    torch.manual_seed(0)
    attn = ConcatHeadsAttention(12, 3).double().eval()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    out, _ = attn(x, causal=True, need_weights=need_weights)
    wq, wk, wv = attn.in_proj.weight.chunk(3)
    bq, bk, bv = attn.in_proj.bias.chunk(3)

    def heads(w, b):
        return (x @ w.T + b).view(2, 5, 3, 4).transpose(1, 2)  # (B, H, T, Dh)

    ref, _ = scaled_dot_product(heads(wq, bq), heads(wk, bk), heads(wv, bv), torch.ones(5, 5).tril().bool())
    torch.testing.assert_close(out, ref.transpose(1, 2).reshape(2, 5, 12))  # concat(head_1, ..., head_H)
    assert not any("out_proj" in k for k in attn.state_dict())


@pytest.mark.parametrize("variant", ["no-wo", "kyubyong"])
def test_the_model_without_w_o_has_none_anywhere_and_decodes_step_by_step_as_it_is_trained(variant):
    m = model(variant=variant)
    attentions = [mod for mod in m.modules() if isinstance(mod, MultiHeadAttention)]
    assert len(attentions) == 6 and all(type(a) is ConcatHeadsAttention for a in attentions)
    assert not any("attn.out_proj" in k for k in m.state_dict())
    assert len(m.state_dict()) == len(model().state_dict()) - 6 * 2  # six W^O weights and biases fewer
    src, tgt = padded_source(), ids(2, 6, seed=1)
    full = m(src, tgt).log_softmax(-1)
    state = m.init_state(m.encode(src))
    for t in range(tgt.size(1)):  # the step path reads the (absent) W^O from StepWeights
        logp, state, _ = m.step(tgt[:, t], state)
        torch.testing.assert_close(logp, full[:, t].float(), atol=1e-5, rtol=1e-5)  # step_log_probs: float32


# --- LayerNorm epsilon --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_his_layer_norm_eps_reaches_every_layer_norm(norm_first):
    norms = [m for m in model(variant="kyubyong", norm_first=norm_first).modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 2 * 3 + 2 * norm_first and {n.eps for n in norms} == {1e-8}
    assert {m.eps for m in model(norm_first=norm_first).modules() if isinstance(m, nn.LayerNorm)} == {1e-5}


# --- positions at padding -----------------------------------------------------------------------------------------
def test_positional_encoding_is_zero_at_padding_and_nothing_else_changes():
    masked, plain = model(variant="kyubyong"), model(variant="no-wo")  # the same weights from the same seed
    for norm in (m for m in plain.modules() if isinstance(m, nn.LayerNorm)):
        norm.eps = 1e-8  # his epsilon: the positions at padding are then the one difference
    src = padded_source()
    emb = masked.src_embed(src) * masked.embed_scale
    pe = masked.positions.table[: src.size(1)].double()
    got = masked.embed(masked.src_embed, src)
    pad = src.eq(PAD_ID)
    torch.testing.assert_close(got[pad], emb[pad])  # no position where the token is padding
    torch.testing.assert_close(got[~pad], (emb + pe)[~pad])
    torch.testing.assert_close(plain.embed(plain.src_embed, src), emb + pe)  # the default adds it everywhere
    # padding is masked as a key everywhere, so every real position computes the same
    tgt = torch.cat([ids(2, 4, seed=2), torch.tensor([[7, 8], [PAD_ID, PAD_ID]])], 1)
    enc_m, enc_p = masked.encode(src), plain.encode(src)
    torch.testing.assert_close(enc_m.memory[~pad], enc_p.memory[~pad])
    real = tgt.ne(PAD_ID)
    torch.testing.assert_close(masked(src, tgt)[real], plain(src, tgt)[real])


# --- dropout on the sublayers -------------------------------------------------------------------------------------
def test_without_sublayer_dropout_the_residual_branch_is_kept_and_attention_dropout_still_applies():
    m = model(dropout=0.5, variant="kyubyong")
    blocks = [mod for mod in m.modules() if type(mod).__name__ == "Residual"]
    assert len(blocks) == 2 * 2 + 2 * 3 and all(b.dropout.p == 0.0 for b in blocks)
    assert m.dropout.p == 0.5  # the embeddings keep theirs
    layer = m.encoder[0]
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    layer.eval()
    expected, _ = layer(x, mask=None)
    layer.train()
    torch.testing.assert_close(layer(x, mask=None)[0], expected)  # nothing dropped in training
    dropped = model(dropout=0.5, attention_dropout=0.5, variant="kyubyong").encoder[0]
    dropped.eval()
    reference, _ = dropped(x, mask=None)
    dropped.train()
    torch.manual_seed(1)
    assert not torch.allclose(dropped(x, mask=None)[0], reference)  # attention dropout is not a sublayer's
    with_dropout = model(dropout=0.5, variant="no-wo").encoder[0].eval()
    kept, _ = with_dropout(x, mask=None)
    torch.manual_seed(1)
    assert not torch.allclose(with_dropout.train()(x, mask=None)[0], kept)  # the paper's blocks drop the branch


# --- defaults and old checkpoints ---------------------------------------------------------------------------------
@pytest.mark.parametrize("old", [{}, OLD_SWITCHES], ids=["paper", "kyubyong"])
def test_the_default_is_the_papers_and_checkpoints_with_the_older_switches_load(tmp_path, monkeypatch, old):
    assert TransformerConfig().variant == "paper"
    variant = "kyubyong" if old else "paper"
    m = build_model("transformer", tiny_model_config(variant=variant))
    assert ("encoder.0.self_attn.out_proj.weight" in m.state_dict()) == (not old)

    to_dict = cfgmod.to_dict

    def with_switches(cfg):  # a config as an older attnkit wrote it: the switches, no variant
        data = to_dict(cfg)
        data["model"].pop("variant")
        data["model"].update({"residual": True, "ffn": True, **old})
        return data

    monkeypatch.setattr(ckptmod.cfgmod, "to_dict", with_switches)
    cfg = cfgmod.RunConfig(model=tiny_model_config(variant=variant))
    ckptmod.save_checkpoint(tmp_path / "old.safetensors", ckptmod.Checkpoint("transformer", cfg, m.state_dict(), {}))
    monkeypatch.undo()
    ckpt = ckptmod.load_checkpoint(tmp_path / "old.safetensors")
    assert ckpt.config.model == tiny_model_config(variant=variant)
    loaded = ckptmod.model_from(ckpt, tmp_path / "old.safetensors")
    assert type(loaded) is type(m)
    for k, v in m.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


# --- presets, schedule, batches of sentences ----------------------------------------------------------------------
def test_the_kyubyong_presets():
    big, small = cfgmod.resolve(["kyubyong"]), cfgmod.resolve(["kyubyong-small"])
    m, t = big.model, big.train
    assert (m.d_model, m.d_ff, m.n_encoder_layers, m.n_decoder_layers, m.n_heads) == (512, 2048, 6, 6, 8)
    assert (m.dropout, m.attention_dropout, m.activation_dropout) == (0.3, 0.3, 0.0)
    assert m.variant == "kyubyong"
    assert (t.lr, t.warmup, t.betas, t.eps, t.label_smoothing, t.max_sentences, t.max_epochs) == (
        3e-4, 4000, (0.9, 0.999), 1e-8, 0.1, 128, 20)
    assert (small.model.d_model, small.model.n_encoder_layers, small.train.warmup) == (256, 3, 600)
    assert small.model.variant == "kyubyong" and small.train.max_sentences == 128


def test_kyubyongs_noam_scheme_is_inverse_sqrt_with_the_peak_at_the_warm_up():
    schedule = make_schedule("inverse_sqrt", lr=3e-4, warmup=4000, d_model=512)
    for global_step in (0, 10, 3999, 4000, 20000):  # his step = global_step + 1, attnkit's update number the same
        step = global_step + 1
        his = 3e-4 * 4000**0.5 * min(step * 4000**-1.5, step**-0.5)
        assert math.isclose(schedule(step), his, rel_tol=1e-12)


def test_batches_hold_at_most_max_sentences():
    lens = torch.randint(1, 20, (100,)).numpy()
    sampler = TokenBatchSampler(lens, lens, 10_000, max_sentences=7, shuffle=True)
    batches = sampler.batches(0)
    assert max(len(b) for b in batches) == 7 and sorted(i for b in batches for i in b) == list(range(100))
    assert max(len(b) for b in TokenBatchSampler(lens, lens, 10_000).batches(0)) > 7


def test_kyubyong_small_trains_translates_and_saves(tmp_path, data_dir, capsys):
    run = tmp_path / "run"
    code = main(["train", "--config", "kyubyong-small", "--data", data_dir, "--out", run, "--quiet",
                 "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--train.max_steps=3",
                 "--train.max_sentences=16", "--train.device=cpu", "--train.dtype=float32", "--train.max_len_b=4"])
    assert code == 0, capsys.readouterr().err
    ckpt = ckptmod.load_checkpoint(run / "checkpoints" / "last.safetensors")
    assert ckpt.config.model.variant == "kyubyong"
    assert not any("attn.out_proj" in k for k in ckpt.model_state)
