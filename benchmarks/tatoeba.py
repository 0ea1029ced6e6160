"""The Tatoeba Chinese-English recipes' evaluation, after `attnkit train --config tatoeba-zh-en` (or tatoeba-en-zh;
docs/results.md "Tatoeba Chinese-English"):

    python benchmarks/tatoeba.py --run runs/tatoeba-zh-en --direction zh-en
    python benchmarks/tatoeba.py --run runs/probe --direction en-zh --sets dev           # a probe: dev only
    python benchmarks/tatoeba.py --ceiling runs/tatoeba-en-zh/data runs/probe-nfkc/data   # what a tokenizer allows
    python benchmarks/tatoeba.py --score runs/fairseq-zh-en/hyp --direction zh-en         # a peer's outputs

1. averages the run's last 5 epoch checkpoints into RUN/checkpoints/avg5.safetensors;
2. chooses, on dev only, between best.safetensors, the average and the ensemble of the same 5 checkpoints by
   greedy BLEU, then the beam-5 length penalty alpha (score / |Y|^alpha);
3. decodes dev and test (`--sets`: a probe that has not been chosen scores dev only) with greedy and beam 5
   (timed), scores them with sacreBLEU tokenised for the target language (zh for Chinese: a Chinese sentence has
   no spaces, and 13a would read it as one word; `--tokenize` overrides), cased and lowercased, and chrF2, with
   sacreBLEU's signatures, and writes the outputs to RUN/hyp/SET.{greedy,beam5}.txt;
4. writes RUN/results.md (a Markdown table) and RUN/results.json.

`--ceiling DATA...` scores the dev references after a round trip through each prepared folder's target tokenizer
(decode(encode(reference))): the best any model trained on that folder can score, whatever it learns; that and
the pieces a sentence takes are how the normalisation and subword settings were compared, on dev only. `--score
DIR` scores DIR/SET.{greedy,beam5}.txt the same way (the fairseq baseline: benchmarks/fairseq_tatoeba.sh).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from multi30k import ALPHAS, decode, normalised, score_table  # the Multi30k recipe's search, alpha grid, table

from attnkit.checkpoint import average_checkpoints, epoch_checkpoints
from attnkit.data import load_tokenizers, read_lines, write_lines
from attnkit.data.dataset import data_languages
from attnkit.decode import DecodeOptions, Translator
from attnkit.eval import Scores, bleu_tokenizer, score_corpus

DIRECTIONS = ("zh-en", "en-zh")
SETS = ("dev", "test")


def read_sets(data: Path, direction: str, names) -> dict[str, tuple[list[str], list[str]]]:
    src, tgt = direction.split("-")
    return {name: (read_lines(data / f"{name}.{src}.gz"), read_lines(data / f"{name}.{tgt}.gz")) for name in names}


def row(scores: Scores, seconds: float | None) -> dict:
    return {"bleu": scores.bleu, "bleu_lc": scores.bleu_lc, "chrf": scores.chrf, "seconds": seconds,
            "signature": scores.signature, "signature_chrf": scores.signature_chrf,
            "tokenizer": scores.tokenizer.describe()}


def choose_on_dev(run: Path, dev: tuple[list[str], list[str]], average: int, score) -> tuple[str, list[Path], float,
                                                                                             dict]:
    """(name, checkpoints, alpha, what was measured) of the candidate with the best dev BLEU, greedy, then its
    beam-5 alpha: test is never read here."""
    last = epoch_checkpoints(run)[-average:]
    avg = run / "checkpoints" / f"avg{average}.safetensors"
    average_checkpoints(last, avg)
    candidates = {"best": [run / "checkpoints" / "best.safetensors"], f"avg{average}": [avg], f"ens{average}": last}
    greedy_bleu, alpha_bleu = {}, {}
    for name, paths in candidates.items():
        hyps, _ = decode(Translator.from_checkpoints(paths, device="cpu"), dev[0], DecodeOptions(beam=1))
        greedy_bleu[name] = score(hyps, dev[1]).bleu
        print(f"dev greedy BLEU of {name}: {greedy_bleu[name]:.2f}", flush=True)
    chosen = max(greedy_bleu, key=greedy_bleu.get)
    translator = Translator.from_checkpoints(candidates[chosen], device="cpu")
    for alpha in ALPHAS:
        hyps, _ = decode(translator, dev[0], DecodeOptions(beam=5, len_penalty=alpha))
        alpha_bleu[alpha] = score(hyps, dev[1]).bleu
        print(f"dev beam-5 BLEU at alpha {alpha}: {alpha_bleu[alpha]:.2f}", flush=True)
    alpha = max(alpha_bleu, key=alpha_bleu.get)
    return chosen, candidates[chosen], alpha, {"dev_greedy_bleu": greedy_bleu, "dev_alpha_bleu": alpha_bleu}


def evaluate_run(args: argparse.Namespace) -> dict:
    run = Path(args.run)
    sets = read_sets(Path(args.data), args.direction, dict.fromkeys(["dev", *args.sets]))
    lang = args.direction.split("-")[1]
    tokenizer = bleu_tokenizer(sets["dev"][1], lang=lang, tokenize=args.tokenize)  # one choice for every set
    print(f"BLEU tokenizer: {tokenizer.describe()}", flush=True)

    def score(hyps, refs):
        return score_corpus([h.text for h in hyps], refs, tokenizer=tokenizer)

    chosen, paths, alpha, measured = choose_on_dev(run, sets["dev"], args.average, score)
    translator = Translator.from_checkpoints(paths, device="cpu")
    results = {"direction": args.direction, "checkpoint": chosen, "alpha": alpha, **measured, "sets": {}}
    (run / "hyp").mkdir(exist_ok=True)
    for name, (src, ref) in sets.items():
        g, g_s = decode(translator, src, DecodeOptions(beam=1))
        b, b_s = decode(translator, src, DecodeOptions(beam=5, len_penalty=alpha))
        at_least = sum(bh.norm_score >= normalised(gh.score, len(gh.tgt_pieces), alpha) - 1e-4 for gh, bh in zip(g, b))
        results["sets"][name] = {"greedy": row(score(g, ref), g_s), f"beam 5, alpha {alpha}": row(score(b, ref), b_s),
                                 "beam_score_at_least_greedy": at_least / len(src)}
        for label, hyps in (("greedy", g), ("beam5", b)):
            write_lines(run / "hyp" / f"{name}.{label}.txt", [h.text for h in hyps])
        print(name, json.dumps(results["sets"][name], indent=1), flush=True)
    return results


def score_outputs(args: argparse.Namespace) -> dict:
    """Scores of another system's outputs, DIR/SET.{greedy,beam5}.txt, as `evaluate_run` scores attnkit's."""
    hyp_dir = Path(args.score)
    sets = read_sets(Path(args.data), args.direction, args.sets)
    lang = args.direction.split("-")[1]
    tokenizer = bleu_tokenizer(read_lines(Path(args.data) / f"dev.{lang}.gz"), lang=lang, tokenize=args.tokenize)
    results = {"direction": args.direction, "system": str(hyp_dir), "sets": {}}
    for name, (_, ref) in sets.items():
        results["sets"][name] = {label: row(score_corpus(read_lines(path), ref, tokenizer=tokenizer), None)
                                 for label in ("greedy", "beam5")
                                 if (path := hyp_dir / f"{name}.{label}.txt").is_file()}
    return results


def ceiling(data_dirs: list[str], references: Path) -> str:
    """Each prepared folder's dev ceiling: the dev references of its target language through its target tokenizer."""
    lines = ["| data | target | normalization | coverage | joint | BLEU ceiling | chrF2 ceiling | references changed | "
             "unknown pieces | pieces a sentence (src / tgt) |", "|---|---|---|---|---|---:|---:|---:|---:|---|"]
    for data in map(Path, data_dirs):
        langs, settings = data_languages(data), json.loads((data / "prepare.json").read_text())["settings"]
        src_tok, tgt_tok = load_tokenizers(data)
        srcs, refs = (read_lines(references / f"dev.{langs[side]}.gz") for side in ("src", "tgt"))
        ids = tgt_tok.encode(refs)
        round_trip = tgt_tok.decode(ids)
        s = score_corpus(round_trip, refs, lang=langs["tgt"])
        changed = sum(a != b for a, b in zip(round_trip, refs))
        unknown = sum(i == 3 for seq in ids for i in seq)
        pieces = f"{sum(map(len, src_tok.encode(srcs))) / len(srcs):.2f} / {sum(map(len, ids)) / len(refs):.2f}"
        lines.append(f"| {data} | {langs['tgt']} | {settings.get('normalization', 'nmt_nfkc')} | "
                     f"{settings.get('character_coverage', 1.0)} | {settings['joint']} | {s.bleu:.2f} | {s.chrf:.2f} | "
                     f"{changed} | {unknown} | {pieces} |")
    return "\n".join(lines) + "\n"


def markdown(results: dict) -> str:
    lines = score_table(results)
    first = next(r for cells in results["sets"].values() for r in cells.values() if isinstance(r, dict))
    lines.append(f"\nBLEU: sacreBLEU {first['signature']}, tokenizer {first['tokenizer']}; chrF2: "
                 f"{first['signature_chrf']}.")
    if "checkpoint" in results:
        shares = ", ".join(f"{n} {100 * cells['beam_score_at_least_greedy']:.1f}%"
                           for n, cells in results["sets"].items())
        lines.append(f"Model: {results['checkpoint']} (chosen on dev greedy BLEU); beam length penalty alpha "
                     f"{results['alpha']} (chosen on dev). Beam 5 finds a model score at least greedy's on: {shares}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", help="the run folder to evaluate")
    ap.add_argument("--direction", choices=DIRECTIONS, default="zh-en")
    ap.add_argument("--data", default="../shared/data/tatoeba-cmn-eng", help="the raw corpus: SET.zh.gz, SET.en.gz")
    ap.add_argument("--average", type=int, default=5, help="epoch checkpoints to average")
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS),
                    help="the sets to decode and score once the choices are made on dev (a probe: dev only)")
    ap.add_argument("--tokenize", help="sacreBLEU's tokenizer (default: the target language's, zh for Chinese)")
    ap.add_argument("--ceiling", nargs="+", metavar="DATA", help="prepared folders: their dev ceilings, no model")
    ap.add_argument("--score", metavar="DIR", help="score DIR/SET.{greedy,beam5}.txt (another system's outputs)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for decoding (2: the recipe's CPU)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.ceiling:
        print(ceiling(args.ceiling, Path(args.data)), end="")
        return
    if args.score:
        results, out = score_outputs(args), Path(args.score)
    elif args.run:
        results, out = evaluate_run(args), Path(args.run)
    else:
        ap.error("give --run, --score or --ceiling")
    (out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    (out / "results.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results), end="")


if __name__ == "__main__":
    main()
