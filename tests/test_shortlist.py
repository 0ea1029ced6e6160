"""Decoding over a lexical shortlist (attnkit.decode.shortlist): every output token is one its sentence's shortlist
allows, a step's log-probabilities are the softmax over the allowed rows' logits alone (Marian's), beam search
carries each row's list through expand and reorder (beam 1 == greedy; a hypothesis's score is its forced score over
the shortlist), a sentence's translation does not depend on its batch, and a checkpoint keeps the shortlist."""

from __future__ import annotations

import pytest
import torch

from attnkit.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from attnkit.config import BOS_ID, EOS_ID, PAD_ID, RunConfig
from attnkit.decode import beam_search, greedy_search
from attnkit.decode.shortlist import Shortlist, Shortlisted, VocabShortlist
from attnkit.models import Transformer
from conftest import tiny_model_config

pytestmark = pytest.mark.usefixtures("one_thread")
V = 40


def shortlist() -> VocabShortlist:
    """Source id s allows targets 4 + (5s + j) % 36, j < 4; ids 0..3 always (first_num 4); the file's ids are the
    model's but shifted by one, so the id maps are exercised."""
    targets = torch.tensor([[4 + (5 * s + j) % 36 for j in range(4)] for s in range(V)]).sort(1).values
    lex = Shortlist(4, 4, torch.arange(0, 4 * V + 1, 4), (targets.flatten() + 1) % V)
    return VocabShortlist(lex, (torch.arange(V) + 1) % V, (torch.arange(V) - 1) % V, shared=False)


def allowed(src_row: torch.Tensor) -> set[int]:
    lex = shortlist()
    ids = lex.src_ids[src_row[src_row.ne(PAD_ID)]].tolist()
    return set(lex.tgt_rows[lex.lex.select(ids, V, shared=False)].tolist())


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    model = Transformer.from_config(tiny_model_config(variant="ssru")).double().eval()
    return model, Shortlisted(model, shortlist())


def source() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, V, (3, 6), generator=g)
    src[:, -1] = EOS_ID
    src[2, 3:] = PAD_ID
    src[2, 3] = EOS_ID
    return src  # (3, 6), the last row padded


def test_every_output_token_is_allowed_and_beam_one_is_greedy(models):
    _, listed = models
    src = source()
    greedy = greedy_search(listed, src, max_len_a=0.0, max_len_b=8)
    assert [g[0].tokens for g in greedy] == [b[0].tokens for b in beam_search(listed, src, beam=1, len_penalty=0.0,
                                                                             max_len_a=0.0, max_len_b=8)]
    for search in (greedy, beam_search(listed, src, beam=4, nbest=2, max_len_a=0.0, max_len_b=8)):
        for row, hyps in enumerate(search):
            assert all(set(h.tokens) <= allowed(src[row]) for h in hyps)


def test_a_step_is_the_softmax_over_the_allowed_rows_and_beams_keep_their_lists(models):
    model, listed = models
    src = source()
    for row, (best,) in enumerate(beam_search(listed, src, beam=3, len_penalty=0.0, max_len_a=0.0, max_len_b=6)):
        tokens = best.tokens + [EOS_ID]
        keep = torch.zeros(V, dtype=torch.bool)
        keep[list(allowed(src[row]))] = True
        with torch.no_grad():
            logits = model(src[row:row + 1], torch.tensor([[BOS_ID, *tokens[:-1]]]))[0]  # (T, V)
        logp = logits.masked_fill(~keep, float("-inf")).log_softmax(-1)  # over the allowed rows' logits alone
        forced = logp.gather(1, torch.tensor(tokens)[:, None]).sum()
        assert float(forced) == pytest.approx(best.score, abs=1e-5)


def test_a_translation_does_not_depend_on_its_batch(models):
    _, listed = models
    src = source()
    together = [g[0].tokens for g in greedy_search(listed, src, max_len_a=0.0, max_len_b=8)]
    alone = [greedy_search(listed, src[i:i + 1], max_len_a=0.0, max_len_b=8)[0][0].tokens for i in range(3)]
    assert together == alone


def test_a_checkpoint_keeps_its_shortlist(models, tmp_path):
    model, _ = models
    path = tmp_path / "listed.safetensors"
    save_checkpoint(path, Checkpoint(kind="transformer", config=RunConfig(model=model.config),
                                     model_state=model.state_dict(), tokenizers={},
                                     shortlist=shortlist().to_tensors()))
    back = VocabShortlist.from_tensors(load_checkpoint(path).shortlist)
    assert back.lex.first_num == 4 and not back.shared
    src = source()
    assert torch.equal(back.mask(src, V), shortlist().mask(src, V))
    save_checkpoint(path, Checkpoint(kind="transformer", config=RunConfig(model=model.config),
                                     model_state=model.state_dict(), tokenizers={}))
    assert load_checkpoint(path).shortlist == {}  # none: decoding over the whole vocabulary
