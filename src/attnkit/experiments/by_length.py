"""`attnkit experiment by-length`: corpus BLEU per source-length bucket for several checkpoints, one line per
model (`by_length.csv`, `by_length.md`, `by_length.png`): the fixed-vector encoder-decoder degrades as
sentences grow, attention does not (Bahdanau et al. 2015, figure 2).

Source length is counted in words of the raw source, as in the papers: whitespace-separated, but in Chinese and
Japanese, written without spaces, every Han or kana character (`source_words`); or in subword pieces (for
compounding languages, or corpora of one-word sentences).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from attnkit.checkpoint import checkpoint_languages
from attnkit.data.text import UNSPACED
from attnkit.decode import DecodeOptions, Translator
from attnkit.errors import AttnkitError
from attnkit.eval.bleu import TokenizerChoice, bleu_tokenizer, score_corpus
from attnkit.experiments.tables import write_table
from attnkit.viz.figure import finish, subplots

SPLITS = {"dev": "valid", "test": "test"}  # table prefix -> split name in a prepared data folder


# --- BLEU by source length ----------------------------------------------------------------------
def source_words(sentence: str) -> int:
    """The length of `sentence` in words: its whitespace-separated words, but where it holds Han or kana (scripts
    written without spaces, where `split` would see a sentence as one word) each such character is a word, and so
    is each run of letters or digits between them (a Latin name, a number), punctuation not. Checked by
    tests/test_bleu_languages.py: test_by_length_counts_chinese_and_japanese_by_character."""
    unspaced = len(UNSPACED.findall(sentence))
    if not unspaced:
        return len(sentence.split())
    rest = UNSPACED.sub(" ", sentence).split()
    return unspaced + sum(any(c.isalnum() for c in word) for word in rest)


def length_buckets(lengths: Sequence[int], n_buckets: int = 5, edges: Sequence[int] | None = None
                   ) -> list[tuple[int, int]]:
    """Inclusive (shortest, longest) source-length ranges covering `lengths`.

    With `edges` the buckets end at those lengths (10, 20 -> up to 10, 11-20, 21 and more); without,
    at quantiles, so that each bucket holds about as many sentences (ties keep a length in one bucket).
    """
    if not len(lengths):
        raise AttnkitError("by-length: no sentences to bucket")
    if n_buckets < 1:
        raise AttnkitError(f"by-length: --buckets must be at least 1, not {n_buckets}")
    lo, hi = int(min(lengths)), int(max(lengths))
    if edges is None:
        qs = np.quantile(np.asarray(lengths), np.linspace(0, 1, n_buckets + 1)[1:-1], method="lower")
        edges = [int(q) for q in qs]
    bounds, start = [], lo
    for edge in sorted(set(int(e) for e in edges)):
        if start <= edge < hi:
            bounds.append((start, edge))
            start = edge + 1
    return bounds + [(start, hi)]


def bucket_label(bucket: tuple[int, int]) -> str:
    return str(bucket[0]) if bucket[0] == bucket[1] else f"{bucket[0]}-{bucket[1]}"


def bucket_scores(lengths: Sequence[int], hyps: Sequence[str], refs: Sequence[str],
                  buckets: Sequence[tuple[int, int]], tokenizer: TokenizerChoice | None = None) -> list[dict]:
    """Corpus BLEU of the sentences in each bucket: [{"bucket", "sentences", "bleu", "bleu_lc"}], every bucket
    tokenised alike (`tokenizer`, else the one all of `refs` call for)."""
    tokenizer = tokenizer or bleu_tokenizer(refs)
    out = []
    for bucket in buckets:
        idx = [i for i, n in enumerate(lengths) if bucket[0] <= n <= bucket[1]]
        if not idx:
            out.append({"bucket": bucket, "sentences": 0, "bleu": float("nan"), "bleu_lc": float("nan")})
            continue
        s = score_corpus([hyps[i] for i in idx], [refs[i] for i in idx], tokenizer=tokenizer)
        out.append({"bucket": bucket, "sentences": len(idx), "bleu": s.bleu, "bleu_lc": s.bleu_lc})
    return out


def checkpoint_label(path: str | Path) -> str:
    """RUN/checkpoints/best.safetensors -> RUN's folder name; other files -> their stem."""
    path = Path(path)
    return path.parent.parent.name if path.parent.name == "checkpoints" else path.stem


def bleu_by_length(checkpoints: dict[str, str | Path], sources: list[str], refs: list[str], out_dir: str | Path,
                   *, options: DecodeOptions | None = None, n_buckets: int = 5, edges: Sequence[int] | None = None,
                   unit: str = "words", metric: str = "bleu", device: str = "auto", tokenize: str | None = None,
                   say: Callable[[str], None] = print) -> dict[str, list[dict]]:
    """Translate `sources` with each checkpoint (label -> path); BLEU per source-length bucket, table + chart.

    unit: "words" (`source_words`) or "pieces" (subwords of the first checkpoint's tokenizer). BLEU is
    tokenised for the target language the first checkpoint records (else the references' script), or `tokenize`.
    """
    if len(sources) != len(refs):
        raise AttnkitError(f"by-length: {len(sources)} sources but {len(refs)} references (not line-aligned)")
    translators = {label: Translator.from_checkpoint(path, device=device) for label, path in checkpoints.items()}
    if unit == "pieces":
        lengths = [len(ids) for ids in next(iter(translators.values())).src_tok.encode(sources)]
    else:
        lengths = [source_words(s) for s in sources]
    buckets = length_buckets(lengths, n_buckets, edges)
    lang = checkpoint_languages(next(iter(checkpoints.values()))).get("tgt")
    tokenizer = bleu_tokenizer(refs, lang=lang, tokenize=tokenize)
    say(f"BLEU tokenizer: {tokenizer.describe()}")
    results = {}
    for label, translator in translators.items():
        say(f"translating {len(sources)} sentences with {label} ({checkpoints[label]})")
        results[label] = bucket_scores(lengths, translator.translate_texts(sources, options=options), refs, buckets,
                                       tokenizer)
    first = next(iter(results.values()))
    header = [f"source {unit}", "sentences"] + [f"{label} {m}" for label in results for m in ("bleu", "bleu_lc")]
    rows = [[bucket_label(b["bucket"]), b["sentences"]]
            + [results[label][i][m] for label in results for m in ("bleu", "bleu_lc")]
            for i, b in enumerate(first)]
    out_dir = Path(out_dir)
    write_table(out_dir, "by_length", header, rows)
    plot_by_length(results, out_dir / "by_length.png", metric, unit)
    return results


def plot_by_length(results: dict[str, list[dict]], path: Path, metric: str = "bleu", unit: str = "words") -> None:
    """One line per model: BLEU against the source-length bucket."""
    fig, axes = subplots(1, 1, 6.0, 3.8)
    ax = axes[0, 0]
    first = next(iter(results.values()))
    x = np.arange(len(first))
    for label, scores in results.items():
        ax.plot(x, [s[metric] for s in scores], marker="o", label=label)
    ax.set_xticks(x, [f"{bucket_label(s['bucket'])}\n({s['sentences']})" for s in first], fontsize=8)
    ax.set_xlabel(f"source length in {unit} (sentences)")
    ax.set_ylabel("sacreBLEU" + (" (lowercased)" if metric == "bleu_lc" else ""))
    ax.set_title("BLEU by source length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    finish(fig, {}, path, dpi=110)
