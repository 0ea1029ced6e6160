"""The SSRU decoder (`model.variant: ssru`, attnkit.nn.ssru): the cell is its equations written out, teacher forcing
over the whole target equals step-by-step decoding (cell states carried, reordered by beam search), no output reads a
later target token, cached decoding equals recomputing every prefix, the searches, scoring, alignments and ensembles
run on it, `model.norm_eps` reaches every LayerNorm, and a tiny model trains and translates through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit.config import BOS_ID, EOS_ID, PAD_ID
from attnkit.decode import beam_search, greedy_search
from attnkit.decode.scoring import score_targets
from attnkit.errors import ConfigError
from attnkit.models import Transformer
from attnkit.models.transformer import removed_parts
from attnkit.nn.ssru import SSRU, SSRUDecoderLayer
from conftest import tiny_model_config

pytestmark = pytest.mark.usefixtures("one_thread")


def model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer.from_config(tiny_model_config(variant="ssru", **kw)).double().eval()


def ids(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 40, shape, generator=torch.Generator().manual_seed(seed))


def padded_source() -> torch.Tensor:
    return torch.cat([ids(2, 7), torch.cat([ids(1, 4, seed=5), torch.full((1, 3), PAD_ID)], 1)])  # (3, 7)


def test_the_cell_is_its_equations_written_out():
    torch.manual_seed(0)
    cell = SSRU(6).double()
    h = torch.randn(2, 5, 6, dtype=torch.float64)
    c, outs = torch.zeros(2, 6, dtype=torch.float64), []
    for t in range(5):
        f = torch.sigmoid(h[:, t] @ cell.forget.weight.T + cell.forget.bias)
        c = f * c + (1 - f) * (h[:, t] @ cell.w.weight.T)
        outs.append(torch.relu(c))
    out, last = cell(h)
    torch.testing.assert_close(out, torch.stack(outs, 1))
    torch.testing.assert_close(last, c)
    assert cell.w.bias is None  # Marian's x~ = h W has no bias
    first, mid = cell(h[:, :2])  # carrying the state on is running the whole sequence
    torch.testing.assert_close(torch.cat([first, cell(h[:, 2:], mid)[0]], 1), out)


def test_the_variant_swaps_the_self_attention_for_the_cell_only():
    m, paper = model(), Transformer.from_config(tiny_model_config())
    assert all(isinstance(layer, SSRUDecoderLayer) for layer in m.decoder)
    assert not any("self_attn" in k for k in m.state_dict() if k.startswith("decoder."))
    ours = {k for k in m.state_dict() if not k.startswith("decoder.")}
    assert ours == {k for k in paper.state_dict() if not k.startswith("decoder.")}
    assert removed_parts(m.config) == ["model.variant: ssru"]  # no export format holds it


@pytest.mark.parametrize("need_weights", [False, True])
def test_teacher_forcing_equals_step_by_step_decoding(need_weights):
    m, src = model(), padded_source()
    tgt = torch.cat([torch.full((3, 1), BOS_ID), ids(3, 5, seed=1)], 1)
    with torch.no_grad():
        enc = m.encode(src)
        full, maps = m.decode(tgt, enc, need_weights=need_weights)
        full = full.log_softmax(-1)  # (B, T, V)
        state = m.init_state(enc)
        for t in range(tgt.size(1)):
            logp, state, cross = m.step(tgt[:, t], state, need_weights=need_weights)
            torch.testing.assert_close(logp, full[:, t].to(logp.dtype))
            if need_weights:  # the alignments: the same cross-attention either way
                for layer, w in enumerate(cross):
                    torch.testing.assert_close(w, maps["cross"][layer][:, :, t])
        assert all(isinstance(c, torch.Tensor) and c.shape == (3, 16) for c in state.self_kv)  # one cell state (B, D)


def test_no_output_reads_a_later_target_token():
    m, src = model(), padded_source()
    tgt = torch.cat([torch.full((3, 1), BOS_ID), ids(3, 6, seed=2)], 1)
    with torch.no_grad():
        base = m(src, tgt)
        for t in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[:, t] = (changed[:, t] + 7) % 36 + 4
            out = m(src, changed)
            torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=0)
            assert not torch.allclose(out[:, t], base[:, t])


def test_cached_decoding_equals_recomputing_every_prefix():
    """Each step from the carried cell states gives what decoding the whole prefix again from nothing gives."""
    m, src = model(), padded_source()
    with torch.no_grad():
        enc = m.encode(src)
        state, prefix = m.init_state(enc), torch.full((3, 1), BOS_ID)
        for _ in range(6):
            cached, state, _ = m.step(prefix[:, -1], state)
            uncached = m.decode(prefix, enc)[0][:, -1].log_softmax(-1)  # (B, V): the prefix again, no state
            torch.testing.assert_close(cached, uncached.to(cached.dtype))
            prefix = torch.cat([prefix, cached.argmax(-1, keepdim=True)], 1)  # its own greedy path


def test_beam_search_reorders_the_cell_states():
    """Beam search reorders the rows every step: the score it gives its best hypothesis is that hypothesis's
    teacher-forced log-probability, which a cell state left in another row's place would change."""
    m, src = model(), padded_source()
    greedy = greedy_search(m, src, max_len_a=0.0, max_len_b=6)
    one = beam_search(m, src, beam=1, len_penalty=0.0, max_len_a=0.0, max_len_b=6)
    assert [g[0].tokens for g in greedy] == [b[0].tokens for b in one]
    for row, (best,) in enumerate(beam_search(m, src, beam=4, len_penalty=0.0, max_len_a=0.0, max_len_b=6)):
        tokens = best.tokens + [EOS_ID]  # the score counts EOS, forced at the length limit too
        tgt_in, tgt_out = torch.tensor([[BOS_ID, *tokens[:-1]]]), torch.tensor([tokens])
        forced = score_targets(m, src[row:row + 1], tgt_in, tgt_out)
        assert float(forced.sum()) == pytest.approx(best.score, abs=1e-5)


def test_norm_eps_reaches_every_layer_norm():
    m = model(norm_eps=1e-6)
    eps = {mod.eps for mod in m.modules() if isinstance(mod, torch.nn.LayerNorm)}
    assert eps == {1e-6}
    assert {mod.eps for mod in model().modules() if isinstance(mod, torch.nn.LayerNorm)} == {1e-5}
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="model.norm_eps must be in"):
            tiny_model_config(norm_eps=bad)


@pytest.fixture(scope="module")
def ssru_run(tmp_path_factory, corpus_files):
    """prepare -> train a tiny SSRU-decoder Transformer a few steps through the CLI."""
    from attnkit.cli.main import main

    root = tmp_path_factory.mktemp("ssru")
    prefix = Path(corpus_files["train"][0]).with_suffix("")
    assert main(["prepare", "--src", "de", "--tgt", "en", "--train", prefix, "--valid", prefix.parent / "valid",
                 "--test", prefix.parent / "test", "--vocab-size", "100", "--out", root / "data"]) == 0
    assert main(["train", "--data", root / "data", "--out", root / "run", "--quiet", "--train.max_steps=6",
                 "--model.variant=ssru", "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32",
                 "--train.max_tokens=300", "--train.device=cpu"]) == 0
    return root / "run" / "checkpoints" / "last.safetensors"


def test_a_tiny_ssru_model_trains_and_translates_through_the_cli(ssru_run):
    from attnkit.checkpoint import load_checkpoint
    from attnkit.decode.translator import Translator

    assert load_checkpoint(ssru_run).config.model.variant == "ssru"
    tr = Translator.from_checkpoint(ssru_run, device="cpu")
    assert isinstance(tr.model.decoder[0], SSRUDecoderLayer)
    sources = ["dreihundertfünfundvierzig", "siebzehn", "zweitausendvierundzwanzig"]
    greedy = tr.translate(sources, beam=1, need_attention=True)
    assert [t.text for t in greedy] == [t.text for t in tr.translate(sources, beam=1, batch_size=1)]
    assert all(t.attention is not None and t.attention.shape[0] == len(t.tgt_pieces) + 1 for t in greedy)
    beam = tr.translate(sources, beam=3, nbest=2)
    assert all(len(t.nbest) == 1 for t in beam)
    scores = tr.score(sources, ["three hundred", "seventeen", "two thousand"])  # forced decoding
    assert len(scores) == 3 and all(s < 0 for s in scores)
    ensemble = Translator.from_checkpoints([ssru_run, ssru_run], device="cpu")  # two alike members: the same
    assert [t.text for t in ensemble.translate(sources, beam=2)] == [t.text for t in tr.translate(sources, beam=2)]
    _, maps = tr.model.attention(torch.tensor([[5, 6, EOS_ID]]), torch.tensor([[BOS_ID, 7]]))
    assert set(maps) == {"encoder", "cross"}  # the SSRU attends to nothing


def test_exports_refuse_the_ssru_decoder_in_one_line(ssru_run, tmp_path):
    from attnkit.formats import export_marian

    with pytest.raises(ConfigError) as e:
        export_marian(ssru_run, tmp_path / "hf")
    assert "model.variant: ssru" in str(e.value) and "\n" not in str(e.value)
