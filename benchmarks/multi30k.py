"""The Multi30k de->en recipe's evaluation, after `attnkit train --config multi30k` (README "Multi30k").

    python benchmarks/multi30k.py --run runs/multi30k --data ../shared/data/multi30k

1. averages the run's last 5 epoch checkpoints (`attnkit average`) into RUN/checkpoints/avg5.safetensors;
2. chooses, on the validation set only, between best.safetensors, the average and the ensemble of the same
   5 checkpoints (`attnkit translate --checkpoint` with several: their probabilities averaged at every step)
   by greedy BLEU, and the beam-5 length penalty alpha (score / |Y|^alpha);
3. decodes val and test_2016_flickr (`--sets`: a probe that has not been chosen scores val only) with greedy
   and beam 5 (timed), scores them with sacreBLEU (cased, lowercased, chrF2) and counts the sentences where
   beam 5 finds a model score at least greedy's;
4. writes RUN/results.md (a Markdown table) and RUN/results.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from attnkit.checkpoint import average_checkpoints, epoch_checkpoints
from attnkit.data import read_lines
from attnkit.decode import DecodeOptions, Translator
from attnkit.eval import score_corpus

ALPHAS = (0.6, 0.8, 1.0, 1.2, 1.4)


def decode(translator: Translator, src: list[str], opts: DecodeOptions) -> tuple[list, float]:
    start = time.perf_counter()
    out = translator.translate(src, opts, batch_size=128)
    return out, time.perf_counter() - start


def normalised(score: float, n_pieces: int, alpha: float) -> float:
    return score / (n_pieces + 1) ** alpha  # EOS counts as a token, as in the beam search


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="runs/multi30k")
    ap.add_argument("--data", default="../shared/data/multi30k")
    ap.add_argument("--average", type=int, default=5, help="epoch checkpoints to average")
    ap.add_argument("--sets", nargs="+", default=["val", "test_2016_flickr"],
                    help="the sets to decode and score once the choices are made on val (a probe: val only)")
    args = ap.parse_args()
    run, data = Path(args.run), Path(args.data)
    torch.set_num_threads(2)
    sets = {name: (read_lines(data / f"{name}.de.gz"), read_lines(data / f"{name}.en.gz"))
            for name in dict.fromkeys(["val", *args.sets])}
    val_src, val_ref = sets["val"]

    last = epoch_checkpoints(run)[-args.average :]
    avg = run / "checkpoints" / f"avg{args.average}.safetensors"
    average_checkpoints(last, avg)
    candidates = {"best": [run / "checkpoints" / "best.safetensors"], f"avg{args.average}": [avg],
                  f"ens{args.average}": last}
    greedy = DecodeOptions(beam=1)
    val_bleu = {}
    for name, paths in candidates.items():
        hyps, _ = decode(Translator.from_checkpoints(paths, device="cpu"), val_src, greedy)
        val_bleu[name] = score_corpus([h.text for h in hyps], val_ref, lang="en").bleu
        print(f"val greedy BLEU of {name}: {val_bleu[name]:.2f}", flush=True)
    chosen = max(val_bleu, key=val_bleu.get)
    translator = Translator.from_checkpoints(candidates[chosen], device="cpu")
    alpha_bleu = {}
    for alpha in ALPHAS:
        hyps, _ = decode(translator, val_src, DecodeOptions(beam=5, len_penalty=alpha))
        alpha_bleu[alpha] = score_corpus([h.text for h in hyps], val_ref, lang="en").bleu
        print(f"val beam-5 BLEU at alpha {alpha}: {alpha_bleu[alpha]:.2f}", flush=True)
    alpha = max(alpha_bleu, key=alpha_bleu.get)

    results = {"checkpoint": chosen, "alpha": alpha, "val_greedy_bleu": val_bleu, "val_alpha_bleu": alpha_bleu,
               "sets": {}}
    for name, (src, ref) in sets.items():
        g, g_s = decode(translator, src, greedy)
        b, b_s = decode(translator, src, DecodeOptions(beam=5, len_penalty=alpha))
        at_least = sum(bh.norm_score >= normalised(gh.score, len(gh.tgt_pieces), alpha) - 1e-4
                       for gh, bh in zip(g, b))
        row = {}
        for label, hyps, secs in (("greedy", g, g_s), (f"beam 5, alpha {alpha}", b, b_s)):
            s = score_corpus([h.text for h in hyps], ref, lang="en")
            row[label] = {"bleu": s.bleu, "bleu_lc": s.bleu_lc, "chrf": s.chrf, "seconds": secs,
                          "signature": s.signature, "signature_chrf": s.signature_chrf}
        row["beam_score_at_least_greedy"] = at_least / len(src)
        results["sets"][name] = row
        print(name, json.dumps(row, indent=1), flush=True)
    (run / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    (run / "results.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))


def score_table(results: dict) -> list[str]:
    """One Markdown row per set and decoding: BLEU cased and lowercased, chrF2, the decoding time (— if not timed)."""
    lines = ["| set | decoding | sacreBLEU cased | sacreBLEU lowercased | chrF2 | decoding time (s) |",
             "|---|---|---:|---:|---:|---:|"]
    for name, row in results["sets"].items():
        for label, r in row.items():
            if isinstance(r, dict):
                seconds = "—" if r["seconds"] is None else f"{r['seconds']:.1f}"
                lines.append(f"| {name} | {label} | {r['bleu']:.2f} | {r['bleu_lc']:.2f} | {r['chrf']:.2f} | "
                             f"{seconds} |")
    return lines


def markdown(results: dict) -> str:
    lines = score_table(results)
    shares = ", ".join(f"{n} {100 * row['beam_score_at_least_greedy']:.1f}%" for n, row in results["sets"].items())
    lines.append(f"\nModel: {results['checkpoint']} (chosen on val greedy BLEU); beam length penalty alpha "
                 f"{results['alpha']} (chosen on val). Beam 5 finds a model score at least greedy's on: {shares}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
