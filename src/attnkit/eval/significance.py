"""chrF++ and TER beside BLEU, and whether one system's translations beat another's: sacreBLEU's paired bootstrap.

`extra_metrics` gives the two scores `attnkit evaluate` prints after BLEU and chrF2: chrF++ (chrF with word
bigrams, Popović 2017) and TER (edits per reference word, Snover et al. 2006; lower is better), both sacreBLEU's,
TER with its Asian-script support where BLEU's tokeniser says the target needs one.

`paired_bootstrap` resamples the test set's sentences with replacement (sacreBLEU's `PairedTest`, 1,000 resamples,
its fixed seed unless SACREBLEU_SEED says otherwise; Koehn 2004) and scores both systems on each resample: per
metric, each system's score, its mean over the resamples with a 95% interval, and the p-value of the difference
(how often a resampled difference, centred on their mean, is larger than the one observed). tests/
test_evaluate_compare.py checks the means against the sentences resampled by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest

from attnkit.errors import DataError
from attnkit.eval.bleu import TokenizerChoice

_SPACELESS = ("zh", "ja-mecab", "ko-mecab", "char")  # BLEU tokenisers of scripts written without spaces


def extra_metrics(tokenizer: TokenizerChoice) -> dict[str, Metric]:
    """chrF++ and TER, as sacreBLEU computes them (TER reading Chinese and Japanese characters as words)."""
    return {"chrF++": CHRF(word_order=2), "TER": TER(asian_support=tokenizer.name in _SPACELESS)}


@dataclass(frozen=True)
class Compared:
    """One metric over both systems: their scores, bootstrap means and 95% half-intervals, and the p-value."""

    metric: str
    scores: tuple[float, float]
    means: tuple[float, float]
    intervals: tuple[float, float]
    p_value: float

    def line(self) -> str:
        (a, b), (ma, mb), (ca, cb) = self.scores, self.means, self.intervals
        return f"{self.metric:7} {a:7.2f} ({ma:.2f} ± {ca:.2f})  {b:7.2f} ({mb:.2f} ± {cb:.2f})  p = {self.p_value:.4f}"


def paired_bootstrap(hyps: list[str], other: list[str], refs: list[str], tokenizer: TokenizerChoice,
                     samples: int = 1000) -> list[Compared]:
    """BLEU and chrF++ of `hyps` (the baseline) and `other` over `samples` paired resamples of the sentences."""
    if not len(hyps) == len(other) == len(refs):
        raise DataError(f"{len(hyps)} hypotheses, {len(other)} to compare and {len(refs)} references: the files "
                        "must be line-aligned")
    metrics = {"BLEU": BLEU(tokenize=tokenizer.name), "chrF++": CHRF(word_order=2)}
    _, results = PairedTest([("hyp", hyps), ("other", other)], metrics, [refs], test_type="bs",
                            n_samples=samples)()
    columns = [pair for column, pair in results.items() if column != "System"]  # in `metrics`' order, sacreBLEU's names
    return [Compared(name, (base.score, alt.score), (base.mean, alt.mean), (base.ci, alt.ci), alt.p_value)
            for name, (base, alt) in zip(metrics, columns, strict=True)]
