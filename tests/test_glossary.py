"""Glossaries: entries read and matched as documented, and constrained beam search puts every target term in the
output (the best such output on a decoder whose probabilities are known), reports the terms it cannot place, and
leaves sentences without terms as they were, through the Python API, the CLI and documents."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from attnkit.cli.main import main
from attnkit.data.glossary import Glossary, Term
from attnkit.data.tokenizer import EOS_ID, PAD_ID, SubwordTokenizer
from attnkit.decode import Translator, translate_document
from attnkit.decode.constrained import NO_ROOM, UNWRITABLE, Progress, constrained_beam_search, term_tokens, unmet_in
from attnkit.decode.scoring import score_targets
from attnkit.errors import ConfigError, DataError
from test_decode import TABLE, A, B, ChainModel, model, sources


def test_glossary_files_are_read_and_bad_lines_named(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("# terms\nHund\tdog\n\n  hot dog \t Würstchen\n", encoding="utf-8")
    assert Glossary.read(path).terms == (Term("Hund", "dog"), Term("hot dog", "Würstchen"))
    path.write_text("Hund\tdog\nKatze cat\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"g.tsv:2: a glossary line is 'source term<TAB>target term'; this one has 1"):
        Glossary.read(path)
    path.write_text("Hund\t \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"g.tsv:1: an empty target term"):
        Glossary.read(path)
    with pytest.raises(DataError, match=r"glossary\[1\]: an empty source term"):
        Glossary.from_pairs([("a", "b"), ("", "c")])


def test_terms_match_whole_words_longest_first_and_anywhere_in_chinese():
    g = Glossary.from_pairs([("dog", "Hund"), ("hot dog", "Würstchen"), ("猫", "Katze"), ("New York", "NY")])
    found = g.terms_in("The Dog ate a hot dog near new  york, then doggy dogs; 我的猫和猫")
    assert [t.source for t in found] == ["dog", "hot dog", "New York", "猫", "猫"]
    inflected = Glossary.from_pairs([("dog", "Hund"), ("Hund", "dog")], inflected=True)
    assert [t.source for t in inflected.terms_in("dogs, Hundes, dogmatics")] == ["dog", "Hund"]
    assert Glossary.from_pairs([("dog", "Hund")]).terms_in("dogs and hotdog") == []


def test_progress_counts_a_constraint_only_when_its_tokens_come_in_a_row():
    cons = [[7, 8], [9]]
    p = Progress((False, False))
    assert p.next_tokens(cons) == {7, 9} and p.bank([2, 1]) == 0
    p = p.advance(7, cons)
    assert (p.inside, p.done, p.bank([2, 1]), p.next_tokens(cons)) == (0, 1, 1, {8})
    assert p.advance(9, cons) == Progress((False, True))  # left the first term (its token counts for nothing)
    p = p.advance(8, cons).advance(5, cons)
    assert p == Progress((True, False)) and p.next_tokens(cons) == {9} and not p.complete
    assert p.advance(9, cons).complete


def _brute_force_constrained(max_len: int, constraint: list[int]) -> list[tuple[float, list[int]]]:
    """Every sequence of at most max_len words of the chain holding `constraint` in a row, best first."""
    out = []
    for n in range(max_len + 1):
        for words in itertools.product([A, B], repeat=n):
            seq = list(words)
            if not any(seq[i : i + len(constraint)] == constraint for i in range(n)):
                continue
            lp, last = 0.0, 1
            for tok in seq + [EOS_ID]:
                lp += math.log(TABLE[last].get(tok, 0.0) or 1e-300)
                last = tok
            out.append((lp, seq))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("constraint", [[A, A], [B, A], [A, B, B]])
def test_the_best_constrained_outputs_of_a_known_decoder_are_found(constraint):
    src = torch.full((1, 3), 7)
    limit = 4 + len(constraint)  # the output limit grows by the constraint's tokens
    best = _brute_force_constrained(limit, constraint)[:3]
    # a beam as wide as the space finds the 3 best (with a small one the banks share it: the search is approximate)
    hyps = constrained_beam_search(ChainModel(), src, [constraint], beam=16, nbest=3, len_penalty=0.0,
                                   max_len_a=0, max_len_b=4)
    assert [h.tokens for h in hyps] == [seq for _, seq in best]
    assert [h.score for h in hyps] == pytest.approx([lp for lp, _ in best])
    assert all(h.unmet == () for h in hyps)


def _holds(tokens: list[int], c: list[int]) -> bool:
    return any(tokens[i : i + len(c)] == c for i in range(len(tokens)))


@pytest.mark.parametrize("seed", range(4))
def test_every_constraint_appears_and_the_score_is_the_models(seed):
    m, src = model(), sources()
    g = torch.Generator().manual_seed(seed)
    for row in range(src.size(0)):
        one = src[row : row + 1, : int(src[row].ne(PAD_ID).sum())]
        cons = [torch.randint(4, 40, (n,), generator=g).tolist() for n in (1, 2, 3)]
        best = constrained_beam_search(m, one, cons, beam=5)[0]
        assert best.unmet == () and all(_holds(best.tokens, c) for c in cons)
        tgt = torch.tensor([[1] + best.tokens]), torch.tensor([best.tokens + [EOS_ID]])
        assert float(score_targets(m, one, *tgt)[0]) == pytest.approx(best.score, abs=1e-4)


def test_a_term_without_room_is_reported_not_dropped():
    m, src = model(), sources()[:1]
    hyps = constrained_beam_search(m, src, [[11, 12, 13]], beam=5, max_len=2)
    assert hyps and hyps[0].unmet == (0,) and len(hyps[0].tokens) <= 2


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> Translator:
    return Translator.from_checkpoint(trained_checkpoint, "cpu")


SOURCES = ["siebzigtausendsiebzehn", "einundachtzig", "elf"]
GLOSSARY = Glossary.from_pairs([("siebzigtausendsiebzehn", "seventy-one"), ("elf", "ninety nine")])


def test_the_translator_places_each_term_and_leaves_other_sentences_alone(translator):
    plain = translator.translate(SOURCES, beam=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every term placed: nothing to warn about
        got = translator.translate(SOURCES, beam=5, glossary=GLOSSARY)
    assert "seventy-one" in got[0].text and "ninety nine" in got[2].text
    assert [u.placed for t in got for u in t.terms] == [True, True]
    assert got[1].text == plain[1].text and got[1].terms == []  # no term: the plain search, the same output
    assert _holds(got[0].tokens, term_tokens(translator.tgt_tok, "seventy-one"))
    beam1 = translator.translate(SOURCES, beam=1, glossary=GLOSSARY)
    assert "seventy-one" in beam1[0].text  # greedy asks: its terms are placed by a beam of GLOSSARY_BEAM


def test_an_unwritable_or_unfitting_term_is_reported(translator):
    unwritable = Glossary.from_pairs([("elf", "日本")])
    with pytest.warns(UserWarning, match=r"input 1: the glossary term 'elf' -> '日本' is not in the translation"):
        got = translator.translate(["elf"], beam=5, glossary=unwritable)[0]
    assert got.terms[0].note == UNWRITABLE and got.text == translator.translate(["elf"], beam=5)[0].text
    long_term = Glossary.from_pairs([("elf", "nine hundred and ninety-nine thousand, nine hundred")])
    with pytest.warns(UserWarning, match="not placed before the output limit"):
        got = translator.translate(["elf"], beam=5, max_len=3, glossary=long_term)[0]
    assert got.terms[0].note == NO_ROOM and not got.terms[0].placed


def test_a_glossary_is_refused_with_sampling_or_prefixes(translator):
    with pytest.raises(ConfigError, match="not with sampling"):
        translator.translate(SOURCES, sampling=True, glossary=GLOSSARY)
    with pytest.raises(ConfigError, match="not with prefixes"):
        translator.translate(SOURCES, prefixes=["a", "b", "c"], glossary=GLOSSARY)


def test_ensembles_and_nbest_keep_the_terms(trained_checkpoint, translator):
    pair = Translator.from_checkpoints([trained_checkpoint, trained_checkpoint], device="cpu")
    got = pair.translate(SOURCES, beam=5, nbest=3, glossary=GLOSSARY)
    alone = translator.translate(SOURCES, beam=5, nbest=3, glossary=GLOSSARY)  # a model twice: the model's search
    assert [[h.text for h in [t, *t.nbest]] for t in got] == [[h.text for h in [t, *t.nbest]] for t in alone]
    placed = [all(u.placed for u in h.terms) for h in [got[0], *got[0].nbest]]
    assert placed[0] and all(placed[i] == _uses_all(h, translator) for i, h in enumerate([got[0], *got[0].nbest]))


def _uses_all(t, translator) -> bool:
    return all(_holds(t.tokens, term_tokens(translator.tgt_tok, u.target)) for u in t.terms)


def test_unmet_counts_each_occurrence_once():
    assert unmet_in([5, 6, 5, 6], [[5, 6], [5, 6]]) == ()
    assert unmet_in([5, 6, 7], [[5, 6], [6, 7], [5, 6]]) == (1, 2)  # overlapping or repeated places are one place


def test_a_translation_that_already_uses_the_terms_stays_as_it_was(translator):
    plain = translator.translate(SOURCES, beam=5)
    word = plain[1].text.split()[1]  # a word after the first: its pieces start with the word mark
    got = translator.translate(SOURCES, beam=5, glossary=Glossary.from_pairs([(SOURCES[1], word)]))
    assert [t.text for t in got] == [t.text for t in plain] and got[1].terms[0].placed


def test_documents_and_the_cli_use_the_glossary(tmp_path, trained_checkpoint, translator, capsys):
    assert "ninety nine" in translate_document(translator, "einundachtzig. elf", lang="de", glossary=GLOSSARY)
    (tmp_path / "g.tsv").write_text("siebzigtausendsiebzehn\tseventy-one\nelf\tninety nine\n", encoding="utf-8")
    (tmp_path / "in.de").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", trained_checkpoint, "--input", tmp_path / "in.de", "--beam", "5",
                 "--glossary", tmp_path / "g.tsv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [t.text for t in translator.translate(SOURCES, beam=5, glossary=GLOSSARY)]
    (tmp_path / "bad.tsv").write_text("elf\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", trained_checkpoint, "--input", tmp_path / "in.de",
                 "--glossary", tmp_path / "bad.tsv"]) == 2
    assert "bad.tsv:1: a glossary line is" in capsys.readouterr().err


def test_a_chinese_term_is_placed_as_it_reads_inside_a_sentence():
    lines = ["我的猫很好。", "猫在这里。", "他有一只猫和一只狗。", "你好吗？"] * 20
    tok = SubwordTokenizer.train(lines, vocab_size=40)
    ids = term_tokens(tok, "猫")
    assert not tok.pieces(ids)[0].startswith("▁")
    assert tok.decode([tok.encode(["我的"])[0] + ids])[0] == "我的猫"
    assert tok.pieces(term_tokens(tok, "Katze"))[0].startswith("▁")  # a spaced term keeps its word start

