"""A model trained in attnkit, out to Hugging Face and back, with real weights (docs/import.md "With real weights").

    python benchmarks/marian_roundtrip.py --checkpoint runs/multi30k/checkpoints/best.safetensors \
        --src ../shared/data/multi30k/test_2016_flickr.de.gz --ref ../shared/data/multi30k/test_2016_flickr.en.gz

1. `attnkit export --format huggingface` writes the checkpoint as a MarianMTModel folder (OUT/hf);
2. `attnkit import --from marian` reads that folder back into a checkpoint (OUT/imported.safetensors);
3. CTranslate2: its own converter (`ctranslate2.converters.TransformersConverter`) is tried on the same folder
   (it assumes Marian's layout: the decoder starts from a zero embedding and the last id is <pad>, whose row it
   drops; an attnkit model starts from a learned BOS row, so the converter refuses or would change the model: the
   script prints what it said), and attnkit's own `export --format ctranslate2`, float32 and int8, is translated
   by CTranslate2 with the same search rules (attnkit's CTranslate2 translator);
4. every system translates the test set greedy and with beam 5 (alpha 1), scored by sacreBLEU; one table, with
   the sentences whose translation differs from the original checkpoint's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnkit.checkpoint import save_checkpoint
from attnkit.data import read_lines
from attnkit.decode import DecodeOptions, Translator
from attnkit.eval import score_corpus
from attnkit.formats.ct2_translator import CT2Translator
from attnkit.formats.ctranslate2 import export_checkpoint
from attnkit.formats.marian import export_marian, import_marian

SEARCHES = {"greedy": DecodeOptions(), "beam 5": DecodeOptions(beam=5, len_penalty=1.0)}


def ct2_converter(hf: Path, out: Path) -> str:
    """What CTranslate2's own Marian converter makes of the exported folder."""
    import ctranslate2

    try:
        ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out), force=True)
    except ValueError as e:
        return f"refused: {e}"
    return f"converted into {out}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--out", default="runs/marian-roundtrip")
    args = ap.parse_args()
    torch.set_num_threads(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hf = export_marian(args.checkpoint, out / "hf", force=True)
    save_checkpoint(out / "imported.safetensors", import_marian(hf))
    print(f"CTranslate2's converter of {hf}: {ct2_converter(hf, out / 'ct2-converter')}\n")
    systems = {
        "attnkit, the checkpoint": lambda: Translator.from_checkpoint(args.checkpoint, device="cpu"),
        "attnkit, exported to HF and imported back": lambda: Translator.from_checkpoint(out / "imported.safetensors",
                                                                                        device="cpu"),
        "attnkit int8, imported back": lambda: Translator.from_checkpoint(out / "imported.safetensors", device="cpu",
                                                                          quantize="int8"),
        "CTranslate2, attnkit's export": lambda: CT2Translator.from_dir(
            export_checkpoint(args.checkpoint, out / "ct2", None, force=True), threads=2),
        "CTranslate2 int8, attnkit's export": lambda: CT2Translator.from_dir(
            export_checkpoint(args.checkpoint, out / "ct2-int8", "int8", force=True), threads=2),
    }
    src, ref = read_lines(args.src), read_lines(args.ref)
    print("| system | greedy BLEU (cased / lc) | changed | beam 5 BLEU (cased / lc) | changed |")
    print("|---|---:|---:|---:|---:|")
    base: dict[str, list[str]] = {}
    for name, load in systems.items():
        translator, cells = load(), []
        for search, opts in SEARCHES.items():
            texts = [h.text for h in translator.translate(src, opts, batch_size=128)]
            base.setdefault(search, texts)
            s = score_corpus(texts, ref, lang="en")
            cells.append(f"{s.bleu:.2f} / {s.bleu_lc:.2f} | {sum(a != b for a, b in zip(texts, base[search]))}")
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
