"""The parts of the Transformer's layer, one variant each (`model.variant`, a small subclass each): no residual
connections, no FFN, no 1 / sqrt(d_k), keys = queries, BatchNorm instead of LayerNorm. Each variant's layer equals the
layer written out by hand with exactly that part taken away; the cached decoder, padding and the searches stay right;
the exporters refuse what their formats cannot hold; older configs' switches become their variant."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from attnkit import config as cfgmod
from attnkit.config import BOS_ID, PAD_ID
from attnkit.decode import beam_search, greedy_search
from attnkit.errors import ConfigError
from attnkit.formats.ctranslate2 import transformer_spec
from attnkit.models import Transformer
from attnkit.models.transformer import VARIANTS, removed_parts
from attnkit.nn.norms import TokenBatchNorm
from conftest import tiny_model_config

SWITCHES = {
    "paper": {},
    "no-residual": dict(variant="no-residual"),
    "no-residual-pre-ln": dict(variant="no-residual", norm_first=True),
    "no-ffn": dict(variant="no-ffn"),
    "no-scale": dict(variant="no-scale"),
    "shared-qk": dict(variant="shared-qk"),
    "batch-norm": dict(variant="batch-norm"),
    "batch-norm-pre-ln": dict(variant="batch-norm", norm_first=True),
}


def model(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer.from_config(tiny_model_config(d_model=32, n_heads=4, **kw)).eval()
    with torch.no_grad():  # biases, norms and running statistics away from their 0 / 1 start, so an error shows
        for name, p in m.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
        for name, stat in m.named_buffers():
            if name.endswith(("running_mean", "running_var")):
                stat.add_(torch.rand_like(stat) * 0.5)
    return m


def ids(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 40, (b, t), generator=torch.Generator().manual_seed(seed))


def written_out_encoder_layer(layer, x: torch.Tensor, *, skip: bool, ffn: bool, scaled: bool, norm_first: bool):
    """One encoder layer from its parameters, by hand: x (B, T, D) -> (B, T, D)."""
    b, t, d = x.shape
    attn = layer.self_attn
    h, w, bias = attn.n_heads, attn.in_proj.weight, attn.in_proj.bias
    if w.size(0) == 2 * d:  # keys = queries: [q; v]
        (wq, wv), (bq, bv) = w.split(d), bias.split(d)
        wk, bk = wq, bq
    else:
        (wq, wk, wv), (bq, bk, bv) = w.split(d), bias.split(d)

    def heads(u):  # (B, T, D) -> (B, H, T, Dh)
        return u.view(b, t, h, d // h).transpose(1, 2)

    def attention(u):
        q, k, v = heads(u @ wq.T + bq), heads(u @ wk.T + bk), heads(u @ wv.T + bv)
        scores = q @ k.transpose(-1, -2) * ((d // h) ** -0.5 if scaled else 1.0)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return out @ attn.out_proj.weight.T + attn.out_proj.bias

    def feed_forward(u):
        return torch.relu(u @ layer.ffn.w1.weight.T + layer.ffn.w1.bias) @ layer.ffn.w2.weight.T + layer.ffn.w2.bias

    def block(u, f, norm):
        def ln(z):  # a LayerNorm, or a BatchNorm in eval mode: its running statistics
            if isinstance(norm, torch.nn.LayerNorm):
                return F.layer_norm(z, (d,), norm.weight, norm.bias, norm.eps)
            return (z - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps) * norm.weight + norm.bias

        if norm_first:
            return (u if skip else 0) + f(ln(u))
        return ln((u if skip else 0) + f(u))

    y = block(x, attention, layer.attn_block.norm)
    return block(y, feed_forward, layer.ffn_block.norm) if ffn else y


@pytest.mark.parametrize("switches", SWITCHES.values(), ids=SWITCHES.keys())
@pytest.mark.parametrize("length", [6, 70], ids=["explicit-path", "fused-sdpa-path"])  # 70 * 70 > 4096: SDPA
def test_each_switched_layer_is_the_layer_written_out_without_that_part(switches, length):
    m = model(**switches)
    c = m.config
    x = torch.randn(2, length, 32)
    layer = m.encoder[0]
    with torch.no_grad():
        expected = written_out_encoder_layer(layer, x, skip=c.variant != "no-residual", ffn=c.variant != "no-ffn",
                                             scaled=c.variant != "no-scale", norm_first=c.norm_first)
        for need_weights in (False, True):
            torch.testing.assert_close(layer(x, mask=None, need_weights=need_weights)[0], expected,
                                       atol=2e-5, rtol=1e-4)


def test_the_switches_remove_exactly_their_parameters():
    d, f, layers = 32, 32, 2 + 2
    paper = sum(p.numel() for p in model().parameters())
    ffn_and_its_norm = 2 * d * f + f + d + 2 * d
    assert sum(p.numel() for p in model(variant="no-ffn").parameters()) == paper - layers * ffn_and_its_norm
    attentions = 2 + 2 * 2  # an encoder layer's one, a decoder layer's two
    assert sum(p.numel() for p in model(variant="shared-qk").parameters()) == paper - attentions * (d * d + d)
    for same in ("no-residual", "no-scale", "batch-norm"):
        assert sum(p.numel() for p in model(variant=same).parameters()) == paper


def test_shared_keys_are_the_queries_projection_in_self_and_cross_attention():
    m, plain = model(variant="shared-qk"), model()
    attn, x, memory = m.decoder[0].cross_attn, torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    q, k, v = m.encoder[0].self_attn.project_qkv(x)
    assert k is q
    cross = attn.project_kv(memory)
    torch.testing.assert_close(cross.k, attn.project_q(memory))
    # the same seed starts every attention from the unshared model's W^Q and W^V rows
    for layer, plain_layer in zip([*m.encoder, *m.decoder], [*plain.encoder, *plain.decoder]):
        w, w_plain = layer.self_attn.in_proj.weight, plain_layer.self_attn.in_proj.weight
        assert torch.equal(w[:32], w_plain[:32]) and torch.equal(w[32:], w_plain[64:])


def test_unscaled_scores_are_the_raw_dot_products():
    m = model(variant="no-scale")
    attn = m.encoder[0].self_attn
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 4, 5, 8)
    torch.testing.assert_close(attn.scores(q, k), q @ k.transpose(-1, -2))
    assert model().encoder[0].self_attn.score_scale == pytest.approx(8**-0.5)


@pytest.mark.parametrize("switches", SWITCHES.values(), ids=SWITCHES.keys())
def test_cached_decoding_padding_and_searches_stay_right_with_every_switch(switches):
    m = model(**switches)
    src = torch.cat([ids(2, 7), torch.cat([ids(1, 4, 5), torch.full((1, 3), PAD_ID)], 1)])
    tgt = torch.cat([torch.full((3, 1), BOS_ID), ids(3, 5, 1)], 1)
    with torch.no_grad():
        full = m(src, tgt).log_softmax(-1)  # (B, T, V)
        state = m.init_state(m.encode(src))
        for t in range(tgt.size(1)):  # one query over the cache: the decoding step's own attention path
            logp, state, _ = m.step(tgt[:, t], state)
            torch.testing.assert_close(logp, full[:, t], atol=1e-5, rtol=1e-5)
        alone = m(src[2:, :4], tgt[2:]).log_softmax(-1)  # the padded sentence without its padding
        torch.testing.assert_close(alone[0], full[2], atol=1e-5, rtol=1e-5)
    greedy = greedy_search(m, src, max_len_a=0.0, max_len_b=6)
    beam = beam_search(m, src, beam=1, len_penalty=0.0, max_len_a=0.0, max_len_b=6)
    assert [g[0].tokens for g in greedy] == [b[0].tokens for b in beam]


@pytest.mark.parametrize("variant", ["no-residual", "no-ffn", "no-scale", "shared-qk", "batch-norm"])
def test_ctranslate2_export_refuses_a_layer_without_one_of_the_papers_parts(variant):
    pytest.importorskip("ctranslate2")
    vocab = [f"w{i}" for i in range(40)]
    with pytest.raises(ConfigError) as e:
        transformer_spec(model(variant=variant), vocab, vocab)
    assert f"model.variant: {variant}" in str(e.value) and "every part of the paper's" in str(e.value)
    assert "\n" not in str(e.value)


def test_every_variant_the_config_names_is_a_subclass_and_only_the_key_picks_it():
    assert set(VARIANTS) == set(cfgmod.VARIANTS)
    for key, cls in VARIANTS.items():
        assert issubclass(cls, Transformer) and cls.variant == key
        assert type(Transformer.from_config(tiny_model_config(variant=key))) is cls
    with pytest.raises(ValueError, match="from_config"):  # the paper's class never builds a variant's config
        Transformer(tiny_model_config(variant="no-ffn"))
    with pytest.raises(ConfigError, match="model.variant must be one of"):
        tiny_model_config(variant="no-norm")


@pytest.mark.parametrize("variant", ["shared-qk", "no-wo", "no-scale", "kyubyong"])
def test_config_refuses_an_attention_variant_with_shaw_positions(variant):
    with pytest.raises(ConfigError, match="both change the attention; choose one"):
        tiny_model_config(positions="shaw", variant=variant)
    assert removed_parts(tiny_model_config()) == removed_parts(tiny_model_config(variant="no-wo")) == []
    assert removed_parts(tiny_model_config(variant="no-ffn")) == ["model.variant: no-ffn"]


@pytest.mark.parametrize("old, variant", [
    ({"residual": False}, "no-residual"), ({"ffn": False}, "no-ffn"), ({"scale_scores": False}, "no-scale"),
    ({"shared_qk": True}, "shared-qk"), ({"norm": "batch"}, "batch-norm"), ({"output_projection": False}, "no-wo"),
    ({"output_projection": False, "sublayer_dropout": False, "layer_norm_eps": 1e-8, "zero_pad_positions": True},
     "kyubyong"),
    ({"residual": True, "ffn": True, "layer_norm_eps": 1e-5, "norm": "layer"}, "paper"),
], ids=str)
def test_an_older_configs_switches_become_their_variant(old, variant):
    """Checkpoints and run folders written before the variants keep loading: their switches map to the variant."""
    data = {"model": {"kind": "transformer", "d_model": 32, **old}, "train": {}}
    got = cfgmod.from_dict(cfgmod.RunConfig, cfgmod.upgrade(data))
    assert got.model.variant == variant and got.model.d_model == 32


@pytest.mark.parametrize("old", [{"residual": False, "ffn": False}, {"layer_norm_eps": 1e-6},
                                 {"output_projection": False, "zero_pad_positions": True}], ids=str)
def test_switches_no_variant_holds_are_refused_in_one_line(old):
    with pytest.raises(ConfigError) as e:
        cfgmod.upgrade({"model": {"kind": "transformer", **old}})
    assert "no model.variant holds these settings" in str(e.value) and "\n" not in str(e.value)


def test_batch_norm_counts_only_the_real_tokens_as_torch_batch_norm_over_them_would():
    """Training: nn.BatchNorm1d over the kept tokens alone is the oracle (outputs, gradients, running statistics);
    padding of any value changes nothing. Eval: the running statistics."""
    norm, oracle = TokenBatchNorm(6), torch.nn.BatchNorm1d(6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-0.5, 0.5)
    oracle.load_state_dict(norm.state_dict())
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1, 3:], keep[2, 1:] = False, False
    weights = torch.arange(6.0)
    for seed in range(2):
        x = (torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(seed)) * 2 + 1).requires_grad_()
        x_oracle = x.detach().clone().requires_grad_()
        moved = x.detach().clone()
        moved[~keep] = 1e3
        torch.testing.assert_close(copy.deepcopy(norm).train()(moved, keep)[keep],
                                   copy.deepcopy(norm).train()(x.detach(), keep)[keep])
        out, expected = norm.train()(x, keep), oracle.train()(x_oracle[keep])  # (B, T, D), (N, D)
        torch.testing.assert_close(out[keep], expected)
        (out[keep] * weights).sum().backward()  # through the statistics, as torch's
        (expected * weights).sum().backward()
        torch.testing.assert_close(x.grad[keep], x_oracle.grad[keep])
        assert not x.grad[~keep].any()
    for name, stat in oracle.state_dict().items():  # the running statistics (unbiased variance) and the count
        torch.testing.assert_close(norm.state_dict()[name], stat)
    x = torch.randn(3, 5, 6)
    torch.testing.assert_close(norm.eval()(x), oracle.eval()(x.reshape(-1, 6)).view(3, 5, 6))


def test_a_batch_norm_transformer_trains_the_same_whatever_its_padding():
    """In training, a sentence's real tokens see the same statistics however much padding the batch carries."""
    m = model(variant="batch-norm", dropout=0.0).train()
    src, tgt = ids(3, 6), torch.cat([torch.full((3, 1), BOS_ID), ids(3, 4, 1)], 1)
    src[2, 4:] = PAD_ID
    tgt[1, 3:] = PAD_ID
    padded = m(torch.cat([src, torch.full((3, 3), PAD_ID)], 1), torch.cat([tgt, torch.full((3, 2), PAD_ID)], 1))
    real = tgt.ne(PAD_ID)
    torch.testing.assert_close(padded[:, :5][real], model(variant="batch-norm", dropout=0.0).train()(src, tgt)[real],
                               atol=1e-5, rtol=1e-5)
