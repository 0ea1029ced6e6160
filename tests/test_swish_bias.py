"""The two features a Marian (opus-mt) model needs, on every path attnkit runs a Transformer through: the swish (SiLU)
FFN activation (`model.activation: swish`) and the bias on the vocabulary logits (`model.output_bias`, `out_bias`).

Oracles: plain torch (`F.silu`, `F.linear`, the softmax's own gradient), the float64 emulation of the int8 product
(tests/test_int8.py), teacher forcing against the cached step, and CTranslate2 running the export."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save as st_save
from torch import nn

from attnkit.checkpoint import Checkpoint, load_checkpoint, model_from, save_checkpoint
from attnkit.cli.main import main
from attnkit.config import PAD_ID, RunConfig, TrainConfig, TransformerConfig, from_dict, to_dict
from attnkit.cpu import for_inference, int8_scheme
from attnkit.cpu.packed import PackedFeedForward, PackedWeights, packed_linear
from attnkit.data import read_lines
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.decode import DecodeOptions, Ensemble, Translator, beam_search, greedy_search
from attnkit.errors import ConfigError
from attnkit.models import Transformer
from attnkit.nn import FeedForward
from conftest import tiny_model_config
from test_int8 import int8_reference, needs_int8

TOKEN = 7  # the token a large output bias makes win


def biased_model(seed: int = 0, **kw) -> Transformer:
    """A tiny swish + output-bias Transformer with a random (non-zero) bias, in eval mode."""
    torch.manual_seed(seed)
    m = Transformer(tiny_model_config(activation="swish", output_bias=True, **kw)).eval()
    with torch.no_grad():
        m.out_bias.normal_()
    return m


def without_bias(m: Transformer) -> Transformer:
    """The same network with its output bias zeroed."""
    other = Transformer(m.config).eval()
    other.load_state_dict(m.state_dict())
    with torch.no_grad():
        other.out_bias.zero_()
    return other


def ids(b: int, t: int, seed: int = 0, vocab: int = 40) -> torch.Tensor:
    return torch.randint(4, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def ffn_reference(ffn: FeedForward, x: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, ffn.w1.weight, ffn.w1.bias)), ffn.w2.weight, ffn.w2.bias)


# --- swish ----------------------------------------------------------------------------------------------------------
def test_swish_is_a_config_choice_and_other_names_are_refused():
    assert TransformerConfig(activation="swish").activation == "swish"
    with pytest.raises(ConfigError, match="model.activation must be one of relu, gelu, swish, not 'silu'"):
        TransformerConfig(activation="silu")


def test_swish_ffn_is_silu_when_training_and_in_a_packed_step():
    """Training (gradients recorded: F.linear, then the activation) and inference through for_inference's
    PackedFeedForward (oneDNN with swish fused into the product, what every decoding step runs) both compute
    W2 silu(W1 x + b1) + b2."""
    torch.manual_seed(1)
    ffn, x = FeedForward(16, 32, activation="swish"), torch.randn(2, 5, 16)
    training = ffn.train()(x)
    assert training.requires_grad
    torch.testing.assert_close(training, ffn_reference(ffn, x), atol=1e-6, rtol=1e-6)
    fast = for_inference(nn.Sequential(ffn.eval()))[0]
    assert isinstance(fast, PackedFeedForward)
    with torch.inference_mode():
        step = fast(x[:, :1])
        fused = packed_linear(PackedWeights(), x, ffn.w1.weight, ffn.w1.bias, activation="swish")
    torch.testing.assert_close(step, ffn_reference(ffn, x[:, :1]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused, F.silu(F.linear(x, ffn.w1.weight, ffn.w1.bias)), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(fused, F.relu(F.linear(x, ffn.w1.weight, ffn.w1.bias)), atol=1e-3)


@needs_int8
@pytest.mark.parametrize("rows", [None, (3, 11)])
def test_int8_swish_product_is_silu_of_the_quantised_product(rows):
    torch.manual_seed(0)
    lin, x = nn.Linear(64, 24), torch.randn(2, 7, 64)
    w, b = (lin.weight, lin.bias) if rows is None else (lin.weight[rows[0] : rows[1]], lin.bias[rows[0] : rows[1]])
    with torch.no_grad():
        out = packed_linear(PackedWeights(int8=True), x, lin.weight, lin.bias, rows=rows, activation="swish")
    ref = F.silu(int8_reference(x, w, b, int8_scheme())).float()
    scale = ref.abs().max().item()
    assert (out - ref).abs().max().item() < 1e-3 * scale
    assert (out - F.silu(F.linear(x, w, b))).abs().max().item() > 1e-6 * scale  # int8 really ran


# --- the output bias ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tables", [dict(), dict(share_embeddings=False, tie_output=False, tgt_vocab_size=30)],
                         ids=["tied", "untied"])
def test_cached_steps_equal_teacher_forcing_with_swish_and_output_bias(tables):
    """The cached step of the inference copy (fused swish, the bias on the packed output product) against teacher
    forcing by the plain model (F.linear, F.silu): the same log-probabilities, reordering included."""
    m = biased_model(**tables)
    fast = for_inference(m)
    src = torch.cat([ids(2, 7), torch.cat([ids(1, 4, 5), torch.full((1, 3), PAD_ID)], 1)])
    tgt = ids(3, 6, 1, m.config.tgt_vocab_size)
    full = m(src, tgt).log_softmax(-1)  # (B, T, V)
    with torch.inference_mode():
        state = fast.init_state(fast.encode(src))
        for t in range(tgt.size(1)):
            logp, state, _ = fast.step(tgt[:, t], state)
            torch.testing.assert_close(logp, full[:, t], atol=1e-5, rtol=1e-5)
        perm = torch.tensor([2, 0, 1])
        a, _, _ = fast.step(tgt[:, 0], state)
        b, _, _ = fast.step(tgt[perm, 0], state.reorder(perm))
    torch.testing.assert_close(b, a[perm])


def test_output_bias_shifts_every_logit_by_its_value_on_every_path():
    """Training forward, the attention views' forward, the cached step and the int8 product: logits minus those of
    the same network with the bias zeroed are the bias, position for position."""
    m = biased_model()
    zero = without_bias(m)
    src, tgt = ids(2, 6), ids(2, 5, 1)
    assert torch.count_nonzero(m.out_bias) == m.config.tgt_vocab_size
    torch.testing.assert_close(m(src, tgt) - zero(src, tgt), m.out_bias.expand(2, 5, -1).detach(), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(m.attention(src, tgt)[0] - zero.attention(src, tgt)[0],
                               m.out_bias.expand(2, 5, -1).detach(), atol=1e-5, rtol=0)
    with torch.inference_mode():
        first = [fast.step(tgt[:, 0], fast.init_state(fast.encode(src)))[0] for fast in map(for_inference, (m, zero))]
    # log-probabilities: the bias up to one constant per row (the normaliser)
    shift = first[0] - first[1] - m.out_bias
    torch.testing.assert_close(shift, shift[:, :1].expand_as(shift), atol=1e-5, rtol=0)


@needs_int8
def test_int8_output_product_carries_the_bias():
    m = biased_model()
    zero = without_bias(m)
    src, tgt = ids(2, 6), ids(2, 5, 1)
    with torch.inference_mode():
        quantised = for_inference(m, int8=True)(src, tgt), for_inference(zero, int8=True)(src, tgt)
        exact = m(src, tgt)
    torch.testing.assert_close(quantised[0] - quantised[1], m.out_bias.expand(2, 5, -1), atol=1e-4, rtol=0)
    assert not torch.equal(quantised[0], exact)  # int8 really ran
    with torch.no_grad():
        m.out_bias[TOKEN] = 50.0
    fast = for_inference(m, int8=True)  # the search runs on its int8 steps
    assert [h[0].tokens for h in greedy_search(fast, ids(3, 5), max_len_a=0.0, max_len_b=6)] == [[TOKEN] * 6] * 3


def test_greedy_beam_and_ensembles_follow_a_large_output_bias():
    m = biased_model()
    src = ids(3, 5)
    plain = greedy_search(without_bias(m), src, max_len_a=0.0, max_len_b=6)
    assert any(h[0].tokens != [TOKEN] * 6 for h in plain)  # the network alone does not say TOKEN
    with torch.no_grad():
        m.out_bias[TOKEN] = 50.0
    for hyps in (greedy_search(m, src, max_len_a=0.0, max_len_b=6),
                 beam_search(m, src, beam=3, nbest=1, max_len_a=0.0, max_len_b=6),
                 greedy_search(Ensemble([m, biased_model(seed=1)]), src, max_len_a=0.0, max_len_b=6)):
        assert [h[0].tokens for h in hyps] == [[TOKEN] * 6] * 3


def test_output_bias_learns_by_the_softmax_gradient():
    """d loss / d out_bias = sum over positions of softmax(logits) - onehot(target): the training path uses it."""
    m = biased_model().train()
    src, tgt_in, tgt_out = ids(2, 6), ids(2, 5, 1), ids(2, 5, 2)
    logits = m(src, tgt_in)
    F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), reduction="sum").backward()
    expected = (logits.detach().softmax(-1) - F.one_hot(tgt_out, m.config.tgt_vocab_size)).sum((0, 1))
    torch.testing.assert_close(m.out_bias.grad, expected, atol=1e-5, rtol=1e-5)


# --- checkpoints ----------------------------------------------------------------------------------------------------
def _tokenizer_blob(data_dir) -> tuple[bytes, int]:
    blob = (data_dir / "tokenizer.model").read_bytes()
    return blob, SubwordTokenizer.from_bytes(blob).vocab_size


def _checkpoint(path, model: Transformer, blob: bytes) -> None:
    cfg = RunConfig(model=model.config, train=TrainConfig(device="cpu", max_len_a=1.0, max_len_b=4))
    save_checkpoint(path, Checkpoint("transformer", cfg, model.state_dict(), {"src": blob}))


def test_output_bias_round_trips_and_older_checkpoints_load_unchanged(data_dir, tmp_path):
    blob, vocab = _tokenizer_blob(data_dir)
    m = biased_model(src_vocab_size=vocab, tgt_vocab_size=vocab)
    _checkpoint(tmp_path / "new.safetensors", m, blob)
    loaded = model_from(load_checkpoint(tmp_path / "new.safetensors"), tmp_path / "new.safetensors").eval()
    assert loaded.config.output_bias and loaded.config.activation == "swish"
    torch.testing.assert_close(loaded.out_bias, m.out_bias)
    # A checkpoint written before output_bias existed: the same file with the key taken out of its config.
    torch.manual_seed(2)
    old_model = Transformer(tiny_model_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
    _checkpoint(tmp_path / "now.safetensors", old_model, blob)
    with safe_open(tmp_path / "now.safetensors", "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iter
    config = json.loads(meta["config"])
    del config["model"]["output_bias"]
    (tmp_path / "old.safetensors").write_bytes(st_save(tensors, metadata={**meta, "config": json.dumps(config)}))
    old = load_checkpoint(tmp_path / "old.safetensors")
    assert not old.config.model.output_bias and "out_bias" not in old.model_state
    restored = model_from(old, tmp_path / "old.safetensors").eval()
    assert restored.out_bias is None
    src, tgt = ids(2, 5), ids(2, 4, 1)
    torch.testing.assert_close(restored(src, tgt), old_model(src, tgt))
    assert from_dict(TransformerConfig, {k: v for k, v in to_dict(old_model.config).items()
                                         if k != "output_bias"}) == old_model.config


# --- CTranslate2 ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def swish_export(data_dir, tmp_path_factory):
    """(checkpoint, its CTranslate2 export): a random swish + output-bias model with the prepared tokenizer."""
    pytest.importorskip("ctranslate2", reason="the CTranslate2 export needs the ctranslate2 package")
    root = tmp_path_factory.mktemp("swish-ct2")
    blob, vocab = _tokenizer_blob(data_dir)
    m = biased_model(src_vocab_size=vocab, tgt_vocab_size=vocab)
    with torch.no_grad():
        m.out_bias.mul_(3.0)  # large enough to decide many a step
    _checkpoint(root / "swish.safetensors", m, blob)
    assert main(["export", "--format", "ctranslate2", "--checkpoint", str(root / "swish.safetensors"), "--out",
                 str(root / "ct2")]) == 0
    return root / "swish.safetensors", root / "ct2"


@pytest.mark.parametrize("options", [dict(beam=1), dict(beam=3, nbest=2)], ids=str)
def test_ctranslate2_export_of_swish_and_output_bias_translates_as_attnkit(swish_export, corpus_files, options):
    from attnkit.formats import CT2Translator
    from test_export_ctranslate2 import assert_same

    ckpt, out = swish_export
    sources = read_lines(corpus_files["test"][0])[:12]
    ours = Translator.from_checkpoint(ckpt, device="cpu")
    theirs = CT2Translator.from_dir(out, threads=1)
    opts = DecodeOptions(**options)
    results = ours.translate(sources, opts)
    assert sum(t.text != "" for t in results) >= len(sources) // 2  # random weights, but words come out
    assert_same(results, theirs.translate(sources, opts), tol=1e-4)
    targets = [t.text for t in results]
    assert ours.score(sources, targets) == pytest.approx(theirs.score(sources, targets), abs=1e-4)


def test_translate_with_either_engine_on_a_swish_export(swish_export, corpus_files, tmp_path, capsys):
    ckpt, out = swish_export
    (tmp_path / "in.txt").write_text("\n".join(read_lines(corpus_files["test"][0])[:6]) + "\n")
    outputs = {}
    for engine, model in (("attnkit", ckpt), ("ctranslate2", out)):
        assert main(["translate", "--engine", engine, "--checkpoint", str(model), "--input", str(tmp_path / "in.txt"),
                     "--device", "cpu"]) == 0
        outputs[engine] = capsys.readouterr().out
    assert outputs["attnkit"] == outputs["ctranslate2"] and outputs["attnkit"].count("\n") == 6
