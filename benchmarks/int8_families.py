"""int8 decoding on every int8 kernel family this CPU can run, against float32 (docs/speed.md "int8 on every CPU").

    python benchmarks/int8_families.py --checkpoint runs/multi30k/checkpoints/avg5.safetensors \
        --src ../shared/data/multi30k/test_2016_flickr.de.gz --ref ../shared/data/multi30k/test_2016_flickr.en.gz

Decodes the source file greedy and with beam 5 in float32, then once per kernel family
(attnkit.bench.int8_families: fbgemm and oneDNN, AVX2 / AVX-512 / VNNI / AMX, each forced in a process of its
own) with `--quantize int8`, and prints one Markdown table: sacreBLEU cased / lowercased per search, the
sentences whose translation differs from float32's, the mean |log-probability of the int8 translation minus that of
the float32 one| (each scored by its own model), and the bits of the inputs / weights the kernels were given. A
family that adds pairs of products in 16 bits runs once per 7-bit side in `--saturating` (weights: attnkit's
choice; inputs: the earlier one, ATTNKIT_INT8_SATURATING=inputs in its process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from attnkit.bench.int8_families import FAMILIES, apply_engine, environment, saturating_side, unavailable
from attnkit.cpu import for_inference, int8_scheme
from attnkit.data import read_lines
from attnkit.decode import DecodeOptions, Translator
from attnkit.eval import score_corpus

SEARCHES = {"greedy": DecodeOptions(), "beam 5": DecodeOptions(beam=5)}
BITS = {"full": "8 / 8", "weights": "8 / 7", "inputs": "7 / 8"}  # attnkit.cpu.int8_scheme's names: inputs / weights


def decode(checkpoint: str, src_file: str, quantize: str | None) -> dict:
    """{search: (texts, scores)} for one precision, in this process; int8 also reports its bits. The int8 copy is
    made again with this process's 7-bit side (ATTNKIT_INT8_SATURATING): a Translator makes it with attnkit's."""
    torch.set_num_threads(2)
    translator = Translator.from_checkpoint(checkpoint, device="cpu", quantize=quantize)
    src = read_lines(src_file)
    scheme = None
    if translator.quantize == "int8":
        side = saturating_side()
        translator.fast = for_inference(translator.model, int8=True, saturating=side)
        scheme = int8_scheme(side)
    out: dict = {"bits": BITS[scheme.name] if scheme else None}
    for name, opts in SEARCHES.items():
        hyps = translator.translate(src, opts, batch_size=128)
        out[name] = ([h.text for h in hyps], [h.score for h in hyps])
    return out


def in_family(family: str, saturating: str, args: argparse.Namespace) -> dict:
    run = subprocess.run([sys.executable, __file__, "--checkpoint", args.checkpoint, "--src", args.src,
                          "--ref", args.ref, "--child"], env=environment(family, saturating), capture_output=True,
                         text=True, check=True)
    return json.loads(run.stdout.splitlines()[-1])


def row(name: str, result: dict, base: dict, refs: list[str]) -> str:
    cells = []
    for search in SEARCHES:
        texts, scores = result[search]
        bleu = score_corpus(texts, refs)
        changed = sum(a != b for a, b in zip(texts, base[search][0]))
        delta = sum(abs(a - b) for a, b in zip(scores, base[search][1])) / len(scores)
        cells.append(f"{bleu.bleu:.2f} / {bleu.bleu_lc:.2f} | {changed} | {delta:.3f}")
    return f"| {name} | {result['bits'] or 'float32'} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--saturating", nargs="+", choices=["weights", "inputs"], default=["weights", "inputs"],
                    help="the 7-bit sides to run on kernels that add pairs in 16 bits")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one family's int8 run, as JSON
    args = ap.parse_args()
    if args.child:
        apply_engine()
        print(json.dumps(decode(args.checkpoint, args.src, "int8")))
        return
    refs = read_lines(args.ref)
    base = decode(args.checkpoint, args.src, None)
    print("| kernels | inputs / weights | greedy BLEU (cased / lc) | changed | mean abs score diff "
          "| beam 5 BLEU (cased / lc) | changed | mean abs score diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    print(row("float32", base, base, refs))
    for family in FAMILIES:
        if why := unavailable(family):
            print(f"| {family} | not run: {why} |")
            continue
        for side in args.saturating if FAMILIES[family].pairs_in_16_bits else ["weights"]:
            print(row(family, in_family(family, side, args), base, refs), flush=True)


if __name__ == "__main__":
    main()
