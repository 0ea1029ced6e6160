"""Glossaries measured: term use and BLEU with and without `--glossary` on a translation model's test set
(docs/results.md, "Glossaries").

    python benchmarks/glossary.py --checkpoint runs/multi30k/checkpoints/best.safetensors \
        --data ../shared/data/multi30k --out benchmarks/results/glossary/multi30k.md

1. A term list from the training pairs alone: for every source word of at least 4 letters, the target word it
   co-occurs with of highest Dice coefficient, 2 c(s, t) / (c(s) + c(t)), kept where each is the other's best, the
   pair is seen together at least MIN_PAIRS times and its Dice reaches the threshold (words lowercased).
2. The protocol of Dinu et al. (2019): a sentence's glossary holds the entries whose source word occurs in its source
   and whose target word occurs in its reference, so every term asked for is a right one.
3. The Dice threshold is chosen on the validation set (BLEU with the glossary); the test set is then decoded with
   and without it, beam 5: the term use rate (the share of the asked terms whose target word is in the output,
   whole words, case ignored), the terms reported as not placed, BLEU, chrF2 and the decoding time of each, on the
   same machine in one run. Each sentence there has a glossary of its own, so those with terms are translated one
   call each, and their time holds the batching they lose.
4. The cost as a user meets it: the test set translated in batches with the chosen list as one glossary (every
   entry whose source word occurs, right or not) against none; `--speed` runs this step alone.
"""

from __future__ import annotations

import argparse
import re
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

from attnkit.data import read_lines
from attnkit.data.glossary import Glossary, Term
from attnkit.decode import DecodeOptions, Translator
from attnkit.eval import score_corpus
from attnkit.io import atomic_write_text

THRESHOLDS = (0.3, 0.5, 0.7)
MIN_PAIRS = 5
WORD = re.compile(r"[^\W\d_]+")


def words(line: str) -> set[str]:
    return set(WORD.findall(line.lower()))


def dictionary(src: list[str], tgt: list[str], threshold: float) -> list[tuple[Term, float]]:
    """Mutually best Dice pairs of the training corpus (module docstring, step 1)."""
    cs, ct, pairs = Counter(), Counter(), Counter()
    for s, t in zip(src, tgt):
        ws, wt = {w for w in words(s) if len(w) >= 4}, words(t)
        cs.update(ws)
        ct.update(wt)
        pairs.update((a, b) for a in ws for b in wt)
    dice = {(a, b): 2 * n / (cs[a] + ct[b]) for (a, b), n in pairs.items() if n >= MIN_PAIRS}
    best_t, best_s = {}, {}
    for (a, b), d in dice.items():
        if d > best_t.get(a, (None, 0))[1]:
            best_t[a] = (b, d)
        if d > best_s.get(b, (None, 0))[1]:
            best_s[b] = (a, d)
    return [(Term(a, b), d) for a, (b, d) in best_t.items() if best_s[b][0] == a and d >= threshold]


def asked(glossary: Glossary, source: str, reference: str) -> list[Term]:
    """The entries of `glossary` in `source` whose target word is in `reference` (step 2)."""
    ref = words(reference)
    return [term for term in glossary.terms_in(source) if term.target in ref]


def translate(translator: Translator, src: list[str], terms: list[list[Term]], opts: DecodeOptions,
              use_glossary: bool) -> tuple[list[str], int, float]:
    """The outputs, the terms reported as not placed, and the seconds taken: the sentences without terms in
    batches, each with terms alone with its own glossary (as a service request with a glossary would be)."""
    out: list[str | None] = [None] * len(src)
    unplaced = 0
    start = time.perf_counter()
    plain = [i for i, t in enumerate(terms) if not (use_glossary and t)]
    for i, t in zip(plain, translator.translate([src[i] for i in plain], opts, batch_size=128)):
        out[i] = t.text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # counted below instead
        for i in (i for i, t in enumerate(terms) if use_glossary and t):
            result = translator.translate([src[i]], opts, glossary=Glossary(tuple(terms[i])))[0]
            out[i] = result.text
            unplaced += sum(not u.placed for u in result.terms)
    return out, unplaced, time.perf_counter() - start  # type: ignore[return-value]


def use_rate(outputs: list[str], terms: list[list[Term]]) -> float:
    hits = [term.target in words(out) for out, ts in zip(outputs, terms) for term in ts]
    return 100 * sum(hits) / max(1, len(hits))


def evaluate(translator: Translator, src: list[str], ref: list[str], glossary: Glossary, opts: DecodeOptions,
             use_glossary: bool) -> dict:
    terms = [asked(glossary, s, r) for s, r in zip(src, ref)]
    out, unplaced, seconds = translate(translator, src, terms, opts, use_glossary)
    scores = score_corpus(out, ref)
    return {"terms": sum(map(len, terms)), "sentences": sum(1 for t in terms if t), "use": use_rate(out, terms),
            "unplaced": unplaced, "bleu": scores.bleu, "chrf": scores.chrf, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", default="../shared/data/multi30k", help="train / val / test_2016_flickr .de/.en.gz")
    ap.add_argument("--src", default="de")
    ap.add_argument("--tgt", default="en")
    ap.add_argument("--test", default="test_2016_flickr")
    ap.add_argument("--out", required=True, help="the Markdown table")
    ap.add_argument("--limit", type=int, default=0, help="the first N sentences of val and test only (a smoke run)")
    ap.add_argument("--speed", type=float, metavar="DICE", help="step 4 alone, with the list of this threshold")
    args = ap.parse_args()
    torch.set_num_threads(2)
    data = Path(args.data)
    split = {name: (read_lines(data / f"{name}.{args.src}.gz"), read_lines(data / f"{name}.{args.tgt}.gz"))
             for name in ("train", "val", args.test)}
    if args.limit:
        split.update({k: (v[0][: args.limit], v[1][: args.limit]) for k, v in split.items() if k != "train"})
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu")
    opts = DecodeOptions(beam=5)
    lists = {th: Glossary(tuple(t for t, _ in dictionary(*split["train"], th))) for th in THRESHOLDS}
    if args.speed is not None:
        print(speed(translator, split[args.test][0], lists[args.speed], opts))
        return
    on_val = {th: evaluate(translator, *split["val"], g, opts, True) for th, g in lists.items()}
    chosen = max(THRESHOLDS, key=lambda th: on_val[th]["bleu"])
    rows = [("val", f"Dice >= {th}", True, r) for th, r in on_val.items()]
    for use in (False, True):
        rows.append((args.test, f"Dice >= {chosen}", use, evaluate(translator, *split[args.test], lists[chosen], opts,
                                                                   use)))
    atomic_write_text(args.out, table(rows, lists, args))
    print(Path(args.out).read_text(encoding="utf-8"))


def speed(translator: Translator, src: list[str], glossary: Glossary, opts: DecodeOptions) -> str:
    """Step 4: seconds for the whole set in batches, without and with the glossary, alternating, best of 3."""
    seconds = {False: [], True: []}
    for _ in range(3):
        for use in (False, True):
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = translator.translate(src, opts, batch_size=128, glossary=glossary if use else None)
            seconds[use].append(time.perf_counter() - start)
    searched = sum(bool(t.terms) for t in out)
    return (f"{len(src)} sentences, {searched} holding terms of the list ({len(glossary.terms)} entries): "
            f"{min(seconds[False]):.1f} s without the glossary, {min(seconds[True]):.1f} s with it "
            f"({min(seconds[True]) / min(seconds[False]):.2f}x)")


def table(rows, lists: dict[float, Glossary], args) -> str:
    lines = [f"`python benchmarks/glossary.py --checkpoint {args.checkpoint} --data {args.data} --out {args.out}`",
             "", "term lists: " + ", ".join(f"Dice >= {th}: {len(g.terms)} entries" for th, g in lists.items()), "",
             "| set | term list | glossary | terms asked (sentences) | term use | not placed | BLEU | chrF2 | "
             "decoding s |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, term_list, use, r in rows:
        lines.append(f"| {name} | {term_list} | {'yes' if use else 'no'} | {r['terms']} ({r['sentences']}) | "
                     f"{r['use']:.1f}% | {r['unplaced']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
