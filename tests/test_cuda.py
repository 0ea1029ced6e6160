"""The CUDA paths, each checked against the CPU's: the fused SDPA kernels (with padding and causal masks, forward
and backward), cached decoding, bf16 autocast, the relative attention of Transformer-XL, cuDNN's recurrent cells,
training and exact resume with the CUDA random state, and int8's refusal.

Skipped where no CUDA device is; `bash benchmarks/cuda.sh` runs them on a GPU machine (docs/speed.md "On a GPU").
Products run in true float32 here (TF32 off), so CPU and GPU agree to float32 rounding.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch

from attnkit.config import TransformerXLConfig
from attnkit.data import BOS_ID, PAD_ID
from attnkit.decode import Translator, beam_search, greedy_search, sample
from attnkit.decode.translator import usable_quantization
from attnkit.eval.lm import evaluate_segments
from attnkit.models import Transformer, build_model
from attnkit.runtime import autocast
from attnkit.train.losses import label_smoothed_nll
from attnkit.train.trainer import Trainer
from conftest import tiny_model_config, tiny_run_config
from test_decode import Uncached
from test_parts import SWITCHES
from test_rnn import IDS, VARIANTS
from test_rnn import model as rnn_model
from test_rnn import sources as rnn_sources
from test_rnn import targets as rnn_targets
from test_train import fit_without_dropout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")
CLOSE = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def true_float32():
    """TF32 rounds products to 10 mantissa bits; the comparisons below are float32 against float32."""
    kept = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = kept


def transformer(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer.from_config(tiny_model_config(**kw)).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Sources (4, 7) and decoder inputs (4, 6), both right-padded in two rows."""
    g = torch.Generator().manual_seed(3)
    src, tgt = torch.randint(4, 40, (4, 7), generator=g), torch.randint(4, 40, (4, 6), generator=g)
    src[1, 5:], src[3, 2:], tgt[2, 4:] = PAD_ID, PAD_ID, PAD_ID
    tgt[:, 0] = BOS_ID
    return src, tgt


def on(device: torch.device, module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` on `device` (the CPU original stays)."""
    return copy.deepcopy(module).to(device)


# --- the encoder-decoder -------------------------------------------------------------------------
LAYERS = {  # every layer the config can build: test_parts.SWITCHES, then pre-LN, no W^O, Kyubyong's, the positions
    **SWITCHES, "pre-ln": dict(norm_first=True), "no-wo": dict(variant="no-wo"), "kyubyong": dict(variant="kyubyong"),
    "learned-positions": dict(positions="learned"), "no-positions": dict(positions="none"),
    "shaw-positions": dict(positions="shaw", relative_clip=3),
}


@pytest.mark.parametrize("layer", LAYERS.values(), ids=LAYERS.keys())
def test_transformer_log_probs_and_gradients_equal_the_cpus(layer):
    """In training mode too (dropout 0): SDPA's backward kernels, and BatchNorm's statistics over the real tokens."""
    m, (src, tgt) = transformer(**layer), padded_batch()
    g = on(CUDA, m)
    torch.testing.assert_close(g(src.to(CUDA), tgt.to(CUDA)).log_softmax(-1).cpu(), m(src, tgt).log_softmax(-1),
                               **CLOSE)
    for model, device in ((m, "cpu"), (g, CUDA)):
        model.train()
        loss, _ = label_smoothed_nll(model(src.to(device), tgt.to(device)), tgt.roll(-1, 1).to(device), epsilon=0.1,
                                     ignore_index=PAD_ID)
        loss.backward()
    for (name, p), q in zip(m.named_parameters(), g.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **CLOSE, msg=name)
    for (name, b), c in zip(m.named_buffers(), g.buffers()):  # BatchNorm's running statistics moved alike
        torch.testing.assert_close(c.cpu(), b, **CLOSE, msg=name)


def test_decoding_on_cuda_equals_decoding_on_the_cpu():
    m, (src, _) = transformer(), padded_batch()
    g, gsrc = on(CUDA, m), src.to(CUDA)
    kw = dict(max_len_a=0, max_len_b=9)
    for search, extra in ((greedy_search, {}), (beam_search, dict(beam=4, nbest=3))):
        cpu, gpu = search(m, src, **kw, **extra), search(g, gsrc, **kw, **extra)
        for c, u in zip(cpu, gpu):
            assert [h.tokens for h in c] == [h.tokens for h in u]
            assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-4)
    greedy = greedy_search(g, gsrc, **kw)
    beam1 = beam_search(g, gsrc, beam=1, len_penalty=0.0, **kw)
    top1 = sample(g, gsrc, top_k=1, generator=torch.Generator(CUDA).manual_seed(0), **kw)
    assert [h[0].tokens for h in beam1] == [h[0].tokens for h in greedy] == [h[0].tokens for h in top1]


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "shaw"])
def test_cached_beam_search_on_cuda_equals_recomputation(positions):
    g, (src, _) = on(CUDA, transformer(positions=positions)), padded_batch()
    kw = dict(beam=4, nbest=3, max_len_a=0, max_len_b=8)
    cached, uncached = beam_search(g, src.to(CUDA), **kw), beam_search(Uncached(g), src.to(CUDA), **kw)
    for c, u in zip(cached, uncached):
        assert [h.tokens for h in c] == [h.tokens for h in u]
        assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-4)


def test_bf16_autocast_on_cuda_tracks_float32():
    g, (src, tgt) = on(CUDA, transformer()), padded_batch()
    src, tgt = src.to(CUDA), tgt.to(CUDA)
    full = label_smoothed_nll(g(src, tgt), tgt.roll(-1, 1), epsilon=0.1, ignore_index=PAD_ID)[0]
    with autocast(CUDA, "bfloat16"):
        logits = g(src, tgt)
    assert logits.dtype == torch.bfloat16  # the products ran in bf16
    half = label_smoothed_nll(logits, tgt.roll(-1, 1), epsilon=0.1, ignore_index=PAD_ID)[0]
    assert half.item() == pytest.approx(full.item(), rel=2e-2)
    half.backward()
    assert all(bool(p.grad.isfinite().all()) for p in g.parameters() if p.grad is not None)


def test_int8_is_refused_on_cuda_with_the_reason():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert usable_quantization("int8", CUDA) is None
    assert len(caught) == 1 and "int8 products run on the CPU only" in str(caught[0].message)


# --- the language models -------------------------------------------------------------------------
LMS = {  # name: (kind, clamp_len, config fields)
    "xl": ("transformer-xl", 0, {}), "xl-same-length-clamped": ("transformer-xl", 6, dict(same_length=True)),
    "vanilla": ("vanilla-lm", 0, {}), "vanilla-learned": ("vanilla-lm", 0, dict(positions="learned")),
    "vanilla-shaw": ("vanilla-lm", 0, dict(positions="shaw", relative_clip=3)),
}


@pytest.mark.parametrize(("kind", "clamp_len", "fields"), LMS.values(), ids=LMS.keys())
def test_language_models_over_segments_equal_the_cpus(kind, clamp_len, fields):
    torch.manual_seed(0)
    cfg = TransformerXLConfig(kind=kind, vocab_size=11, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0,
                              **fields)
    m = build_model(kind, cfg).eval()
    g = on(CUDA, m)
    x = torch.randint(11, (2, 15), generator=torch.Generator().manual_seed(1))
    mems, gmems = None, None
    for start in range(0, 15, 5):  # three segments, the memory carried
        logits, mems = m(x[:, start : start + 5], mems, mem_len=8, clamp_len=clamp_len)
        glogits, gmems = g(x[:, start : start + 5].to(CUDA), gmems, mem_len=8, clamp_len=clamp_len)
        torch.testing.assert_close(glogits.cpu(), logits, **CLOSE)
        for a, b in zip(gmems, mems):
            torch.testing.assert_close(a.cpu(), b, **CLOSE)
    cpu = evaluate_segments(m, x[0], tgt_len=5, mem_len=8, clamp_len=clamp_len)
    gpu = evaluate_segments(g, x[0], tgt_len=5, mem_len=8, clamp_len=clamp_len, device=CUDA)
    assert gpu.tokens == cpu.tokens and gpu.nll == pytest.approx(cpu.nll, rel=1e-5)


# --- the RNN encoder-decoders (cuDNN's cells) ----------------------------------------------------
@pytest.mark.parametrize(("kind", "kw"), VARIANTS, ids=IDS)
def test_rnn_models_equal_the_cpus(kind, kw):
    m, src, tgt = rnn_model(kind, **kw), rnn_sources(), rnn_targets()
    g = on(CUDA, m)
    torch.testing.assert_close(g(src.to(CUDA), tgt.to(CUDA)).cpu(), m(src, tgt), **CLOSE)
    cpu, gpu = greedy_search(m, src, max_len_a=0, max_len_b=6), greedy_search(g, src.to(CUDA), max_len_a=0, max_len_b=6)
    assert [h[0].tokens for h in cpu] == [h[0].tokens for h in gpu]


# --- training on CUDA ----------------------------------------------------------------------------
def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}


def test_training_on_cuda_resumes_where_it_stopped(tmp_path, data_dir):
    """Dropout draws from the CUDA generator: a resume that did not restore it would move every weight by about
    one update (~1e-3 at this learning rate); CUDA's atomics in the embedding gradient leave ~1e-7."""
    straight = Trainer(tiny_run_config(max_steps=14, device="cuda"), data_dir, tmp_path / "a", progress=False)
    straight.fit()
    first = Trainer(tiny_run_config(max_steps=7, device="cuda"), data_dir, tmp_path / "b", progress=False)
    first.fit()
    resumed = Trainer(tiny_run_config(max_steps=14, device="cuda"), data_dir, tmp_path / "b", resume=True,
                      progress=False)
    assert resumed.state.step == 7
    resumed.fit()
    a, b = _params(straight), _params(resumed)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=2e-5, rtol=0, msg=k)
    assert not torch.backends.cuda.matmul.allow_tf32  # the trainer's TF32 did not outlive it (the fixture's state)


def test_a_bf16_run_trained_on_cuda_translates_there_as_on_the_cpu(tmp_path, data_dir, corpus_files):
    Trainer(tiny_run_config(max_steps=8, device="cuda", dtype="bfloat16"), data_dir, tmp_path / "r",
            progress=False).fit()
    path = tmp_path / "r" / "checkpoints" / "last.safetensors"
    sentences = Path(corpus_files["test"][0]).read_text(encoding="utf-8").splitlines()[:12]
    cpu = Translator.from_checkpoint(path, device="cpu").translate_texts(sentences, beam=3)
    gpu = Translator.from_checkpoint(path, device="cuda").translate_texts(sentences, beam=3)
    assert gpu == cpu


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_model_compiled_on_cuda_trains_like_the_eager_one(tmp_path, data_dir, dtype):
    """Inductor's Triton kernels, forward and backward (the CPU's tests capture the graphs with aot_eager)."""
    eager = fit_without_dropout(tmp_path, data_dir, "eager", device="cuda", dtype=dtype)
    compiled = fit_without_dropout(tmp_path, data_dir, "compiled", device="cuda", dtype=dtype, compile=True)
    a, b = eager.evaluate()["loss"], compiled.evaluate()["loss"]
    assert abs(a - b) < (0.01 if dtype == "float32" else 0.03) * a, (a, b)
    assert all(bool(p.isfinite().all()) for p in compiled.model.parameters())
