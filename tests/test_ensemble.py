"""Checkpoint ensembles: the mean of the members' probabilities at every step, against a naive mixture that
recomputes every prefix (no cache) and averages probabilities in plain float64 arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from attnkit.cli.main import main
from attnkit.config import RNNConfig
from attnkit.decode import DecodeOptions, Ensemble, Translator, beam_search, greedy_search, score_targets
from attnkit.errors import CheckpointError, ConfigError
from attnkit.models import Transformer, build_model
from conftest import tiny_model_config
from test_decode import _batch_for, sources


def transformers(n: int) -> list[Transformer]:
    out = []
    for seed in range(n):
        torch.manual_seed(seed)
        out.append(Transformer(tiny_model_config()).eval())
    return out


@dataclass
class Prefixes:
    """The rows' sources and the tokens fed so far: nothing cached."""

    src: torch.Tensor  # (N, S)
    tokens: torch.Tensor  # (N, t)

    def reorder(self, rows, *, within_sentences=False):
        return Prefixes(self.src.index_select(0, rows), self.tokens.index_select(0, rows))

    def expand(self, beams):
        return self.reorder(torch.arange(self.src.size(0)).repeat_interleave(beams))


class NaiveMixture:
    """log((p_1 + ... + p_M) / M) in float64, every member running its teacher-forced forward over the whole
    prefix at every step."""

    def __init__(self, models):
        self.models = models

    def encode(self, src):
        return src

    def init_state(self, src):
        return Prefixes(src, torch.empty(src.size(0), 0, dtype=torch.long))

    def step(self, tokens, state, need_weights=False):
        seq = torch.cat([state.tokens, tokens[:, None]], 1)
        probs = [m(state.src, seq)[:, -1].double().softmax(-1) for m in self.models]  # (N, V) each
        return (sum(probs) / len(probs)).log().float(), Prefixes(state.src, seq), None


@pytest.mark.parametrize("n", [2, 3])
def test_ensemble_greedy_and_beam_equal_the_naive_mixture(n):
    models, src = transformers(n), sources()
    ens, naive = Ensemble(models), NaiveMixture(models)
    for search, kw in ((greedy_search, {}), (beam_search, {"beam": 4, "nbest": 3})):
        got = search(ens, src, max_len_a=0, max_len_b=8, **kw)
        want = search(naive, src, max_len_a=0, max_len_b=8, **kw)
        for g, w in zip(got, want):
            assert [h.tokens for h in g] == [h.tokens for h in w]
            assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-4)


def test_the_ensemble_differs_from_each_member_and_one_member_is_the_model():
    models, src = transformers(2), sources()
    alone = greedy_search(models[0], src, max_len_a=0, max_len_b=8)
    single = greedy_search(Ensemble(models[:1]), src, max_len_a=0, max_len_b=8)
    assert [h[0].tokens for h in single] == [h[0].tokens for h in alone]
    assert [h[0].score for h in single] == pytest.approx([h[0].score for h in alone], abs=1e-5)
    pair = greedy_search(Ensemble(models), src, max_len_a=0, max_len_b=8)
    assert [h[0].tokens for h in pair] != [h[0].tokens for h in alone]  # the second member changes the search


def test_ensemble_beam_one_is_greedy_and_forced_scoring_returns_its_score():
    ens, src = Ensemble(transformers(2)), sources()
    greedy = greedy_search(ens, src, max_len_a=0, max_len_b=30)  # long enough to end in EOS
    beam = beam_search(ens, src, beam=1, len_penalty=0.0, max_len_a=0, max_len_b=30)
    assert [b[0].tokens for b in beam] == [g[0].tokens for g in greedy]
    tgt_in, tgt_out = _batch_for([g[0].tokens for g in greedy])
    forced = score_targets(ens, src, tgt_in, tgt_out)
    assert forced.tolist() == pytest.approx([g[0].score for g in greedy], abs=1e-4)


def test_a_transformer_and_an_rnn_decode_together_with_the_first_members_attention():
    torch.manual_seed(0)
    rnn = build_model("rnn-bahdanau", RNNConfig(kind="rnn-bahdanau", src_vocab_size=40, tgt_vocab_size=40,
                                                embed_dim=12, hidden=16, dropout=0.0)).eval()
    models, src = [transformers(1)[0], rnn], sources()
    got = beam_search(Ensemble(models), src, beam=3, max_len_a=0, max_len_b=6, need_attention=True)
    want = beam_search(NaiveMixture(models), src, beam=3, max_len_a=0, max_len_b=6)
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
    # the Transformer's last layer (its heads), not the RNN's one map
    assert got[0][0].attention.shape[1:] == (models[0].config.n_heads, src.size(1))


def test_members_must_share_the_target_vocabulary():
    torch.manual_seed(0)
    other = Transformer(tiny_model_config(tgt_vocab_size=41, share_embeddings=False)).eval()
    with pytest.raises(ConfigError, match="different target vocabularies"):
        Ensemble([transformers(1)[0], other])


def test_translator_and_cli_ensemble_checkpoints_of_one_dataset(family_checkpoints, trained, tmp_path, capsys):
    paths = [family_checkpoints["transformer"], family_checkpoints["rnn-bahdanau"]]
    ens = Translator.from_checkpoints(paths, device="cpu")
    assert isinstance(ens.model, Ensemble) and len(ens.model) == 2
    sentences = ["drei", "vierzehn", "einhundert"]
    opts = DecodeOptions(beam=3)
    got = ens.translate(sentences, opts)
    singles = [Translator.from_checkpoint(p, device="cpu") for p in paths]
    # log of a mean >= the mean of the logs (Jensen), token by token: the ensemble's log-probability of any
    # output is at least the members' average one, and equals neither member's
    for t in got:
        member_lp = [s.score([t.source], [t.text])[0] for s in singles]
        ens_lp = ens.score([t.source], [t.text])[0]
        assert ens_lp >= sum(member_lp) / 2 - 1e-4
        assert min(abs(ens_lp - lp) for lp in member_lp) > 1e-4
    assert ens.search_bytes(4, 10, opts) == 2 * singles[0].search_bytes(4, 10, opts)
    with pytest.raises(CheckpointError, match="other tokenizers"):
        Translator.from_checkpoints([paths[0], trained[1] / "checkpoints" / "best.safetensors"], device="cpu")
    src = tmp_path / "in.de"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    assert main(["translate", "--checkpoint", str(paths[0]), str(paths[1]), "--input", str(src),
                 "--output", str(out), "--beam", "3", "--device", "cpu"]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == [t.text for t in got]
    assert main(["translate", "--engine", "ctranslate2", "--checkpoint", str(paths[0]), str(paths[1]),
                 "--input", str(src)]) != 0
    assert "ensembles of several checkpoints run with --engine attnkit" in capsys.readouterr().err
