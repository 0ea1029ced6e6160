"""`attnkit evaluate`'s chrF++, TER and paired bootstrap (`--compare`): the scores are sacreBLEU's corpus scores, the
bootstrap means are those of the sentences resampled by hand with sacreBLEU's seed, and the test tells a clearly
better system from a baseline but not a system from itself with one sentence changed."""

from __future__ import annotations

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF, TER

from attnkit.cli.main import main
from attnkit.errors import DataError
from attnkit.eval import bleu_tokenizer
from attnkit.eval.significance import extra_metrics, paired_bootstrap

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "house", "red", "small", "big", "quickly"]


def corpus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(4, 10))) for _ in range(n)]


def noisy(refs: list[str], rate: float, seed: int) -> list[str]:
    """Each word of each reference swapped for a random one with probability `rate`."""
    rng = np.random.default_rng(seed)
    return [" ".join(w if rng.random() > rate else str(rng.choice(WORDS)) for w in r.split()) for r in refs]


def test_extra_metrics_are_sacrebleus_and_ter_reads_chinese_characters():
    refs = corpus(40, 0)
    hyps = noisy(refs, 0.3, 1)
    metrics = extra_metrics(bleu_tokenizer(refs, lang="en"))
    assert metrics["chrF++"].corpus_score(hyps, [refs]).score == CHRF(word_order=2).corpus_score(hyps, [refs]).score
    assert metrics["TER"].corpus_score(hyps, [refs]).score == TER().corpus_score(hyps, [refs]).score
    assert extra_metrics(bleu_tokenizer(["我们走了。"], lang="zh"))["TER"].asian_support


def test_paired_bootstrap_against_a_written_out_resampling():
    refs = corpus(60, 2)
    base, other = noisy(refs, 0.5, 3), noisy(refs, 0.2, 4)
    tok = bleu_tokenizer(refs, lang="en")
    got = {c.metric: c for c in paired_bootstrap(base, other, refs, tok, samples=200)}
    idx = np.random.default_rng(12345).choice(len(refs), size=(200, len(refs)), replace=True)  # sacreBLEU's seed
    for name, metric in (("BLEU", BLEU()), ("chrF++", CHRF(word_order=2))):
        c = got[name]
        assert c.scores == pytest.approx([metric.corpus_score(h, [refs]).score for h in (base, other)])
        means = [np.mean([metric.corpus_score([h[i] for i in row], [[refs[i] for i in row]]).score for row in idx])
                 for h in (base, other)]
        assert c.means == pytest.approx(means, abs=1e-2)
        assert c.p_value < 0.01 and all(ci > 0 for ci in c.intervals)


def test_one_changed_sentence_is_not_significant():
    refs = corpus(80, 5)
    base = noisy(refs, 0.3, 6)
    other = [*base[:-1], refs[-1]]  # the last sentence made perfect
    for c in paired_bootstrap(base, other, refs, bleu_tokenizer(refs, lang="en"), samples=300):
        assert c.p_value > 0.05, c


def test_files_of_other_lengths_are_refused():
    with pytest.raises(DataError, match="3 hypotheses, 2 to compare and 3 references"):
        paired_bootstrap(["a"] * 3, ["a"] * 2, ["a"] * 3, bleu_tokenizer(["a"], lang="en"))


def test_the_evaluate_verb_prints_chrf_pp_ter_and_the_comparison(tmp_path, capsys):
    refs = corpus(50, 7)
    for name, lines in (("ref", refs), ("a", noisy(refs, 0.5, 8)), ("b", noisy(refs, 0.1, 9))):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["evaluate", "--hyp", tmp_path / "a.txt", "--ref", tmp_path / "ref.txt", "--tgt-lang", "en"]
    assert main(args) == 0
    out = capsys.readouterr().out
    chrf_pp = CHRF(word_order=2).corpus_score(noisy(refs, 0.5, 8), [refs]).score
    assert f"chrF++ {chrf_pp:.2f}, TER " in out and "compare" not in out
    assert main([*args, "--compare", tmp_path / "b.txt", "--bootstrap-samples", "100"]) == 0
    out = capsys.readouterr().out
    assert "paired bootstrap, 100 resamples" in out and "BLEU" in out and "chrF++" in out and "p = " in out
