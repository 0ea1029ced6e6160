"""How closely `--engine ctranslate2` follows attnkit on a test set: hypotheses, scores, alignments.

    python benchmarks/ctranslate2_parity.py --checkpoint runs/multi30k/checkpoints/avg5.safetensors \
        --export runs/multi30k/ct2 --src ../shared/data/multi30k/test_2016_flickr.de.gz

Translates the sources with attnkit's Translator and with the CTranslate2 export under several search settings
and prints, for each, how many hypotheses (n-best lists included) are token for token the same, the largest score
difference among those, and how many alignments agree: one markdown table on stdout (docs/ctranslate2.md has
the Multi30k one); no timings.
"""

from __future__ import annotations

import argparse
import warnings

import torch

from attnkit.data import read_lines
from attnkit.decode import DecodeOptions, Translator
from attnkit.formats import CT2Translator

SETTINGS = [  # (label, options, with alignments)
    ("greedy", dict(beam=1), True),
    ("beam 5, n-best 5", dict(beam=5, nbest=5), True),
    ("beam 5, GNMT length penalty 0.6, n-best 2", dict(beam=5, len_penalty=0.6, len_style="gnmt", nbest=2), False),
    ("greedy, --min-len 5 --no-repeat-ngram 2", dict(beam=1, min_len=5, no_repeat_ngram=2), False),
    ("beam 5, --min-len 5", dict(beam=5, min_len=5), False),
    ("beam 5, --no-repeat-ngram 3", dict(beam=5, no_repeat_ngram=3), False),
]


def compare(ours, theirs, alignments: bool) -> tuple[int, int, float, int]:
    """(hypotheses, identical, largest |score or normalised score difference| among the identical, same alignments)."""
    total = same = aligned = 0
    largest = 0.0
    for a, c in zip(ours, theirs, strict=True):
        for x, y in zip([a, *a.nbest], [c, *c.nbest], strict=True):
            total += 1
            if x.tgt_pieces == y.tgt_pieces:
                same += 1
                largest = max(largest, abs(x.score - y.score), abs(x.norm_score - y.norm_score))
                aligned += alignments and x.alignment == y.alignment
    return total, same, largest, aligned


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="the attnkit checkpoint")
    p.add_argument("--export", required=True, help="its export: `attnkit export --format ctranslate2`")
    p.add_argument("--src", required=True, help="source sentences, one per line (plain or .gz)")
    p.add_argument("--threads", type=int, default=2, help="threads for both engines")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sources = read_lines(args.src)
    ours = Translator.from_checkpoint(args.checkpoint, device="cpu")
    theirs = CT2Translator.from_dir(args.export, threads=args.threads)
    print("| search | hypotheses | token for token the same | largest score difference among them | alignments |")
    print("|---|---:|---:|---:|---:|")
    for label, options, alignments in SETTINGS:
        opts = DecodeOptions(**options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # beam search with bans warns that it may differ: measured here
            results = [engine.translate(sources, opts, need_attention=alignments) for engine in (ours, theirs)]
        total, same, largest, aligned = compare(*results, alignments)
        print(f"| {label} | {total} | {same} | {largest:.1e} | {f'{aligned} same' if alignments else '—'} |")


if __name__ == "__main__":
    main()
