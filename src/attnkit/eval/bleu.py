"""Corpus scores with sacreBLEU on detokenised text against raw references."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from attnkit.errors import DataError


@dataclass(frozen=True)
class Scores:
    bleu: float  # cased sacreBLEU, 13a tokenisation
    bleu_lc: float  # lowercased
    chrf: float
    exact: float  # share of hypotheses equal to their reference, in percent
    signature: str
    signature_lc: str

    def summary(self) -> str:
        return (f"BLEU {self.bleu:.2f} (cased) / {self.bleu_lc:.2f} (lowercased), chrF2 {self.chrf:.2f}, "
                f"exact match {self.exact:.1f}%")


def exact_match(hyps: list[str], refs: list[str]) -> float:
    return 100.0 * sum(h.strip() == r.strip() for h, r in zip(hyps, refs)) / max(1, len(refs))


def score_corpus(hyps: list[str], refs: list[str]) -> Scores:
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references: the files must be line-aligned")
    bleu, bleu_lc, chrf = BLEU(), BLEU(lowercase=True), CHRF()
    return Scores(
        bleu=bleu.corpus_score(hyps, [refs]).score,
        bleu_lc=bleu_lc.corpus_score(hyps, [refs]).score,
        chrf=chrf.corpus_score(hyps, [refs]).score,
        exact=exact_match(hyps, refs),
        signature=str(bleu.get_signature()),
        signature_lc=str(bleu_lc.get_signature()),
    )
