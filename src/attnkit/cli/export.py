"""`attnkit export`: a trained Transformer as a model for another inference engine (CTranslate2)."""

from __future__ import annotations

from collections.abc import Callable

from attnkit.cli.options import add_checkpoint_option
from attnkit.errors import AttnkitError

# attnkit.export.ctranslate2.QUANTIZATIONS, spelled out here so that `--help` imports neither torch nor ctranslate2
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16")


def add_parsers(sub) -> dict[str, Callable]:
    ex = sub.add_parser("export", help="write a Transformer checkpoint as a CTranslate2 model folder",
                        description=EXPORT_DESCRIPTION)
    ex.add_argument("--format", choices=["ctranslate2"], default="ctranslate2",
                    help="the inference engine to export for: CTranslate2 (OpenNMT's C++ engine; pip install "
                         "ctranslate2)")
    add_checkpoint_option(ex, nargs="+", metavar="CKPT",
                          help="a .safetensors checkpoint written by attnkit (one: a CTranslate2 model is one network; "
                               "several are refused, `attnkit average` makes them one)")
    ex.add_argument("--out", required=True, help="the model folder to write (with the tokenizer and attnkit.json)")
    ex.add_argument("--quantization", choices=QUANTIZATIONS,
                    help="store the weights in this type (int8: about 4x smaller; default: float32 as trained)")
    ex.add_argument("--force", action="store_true", help="replace an existing model folder")
    return {"export": cmd_export}


EXPORT_DESCRIPTION = """\
Write a Transformer checkpoint as a CTranslate2 model folder: the weights, the vocabulary, the
sentencepiece model and attnkit.json (the tokenizer and decoding defaults that go with it). Then
`attnkit translate --engine ctranslate2 --checkpoint FOLDER` translates with it as with the checkpoint.
Transformer-XL language models and RNN encoder-decoders have no CTranslate2 equivalent.

  attnkit export --checkpoint runs/multi30k/checkpoints/avg5.safetensors --out runs/multi30k/ct2
  attnkit export --checkpoint CKPT --out runs/multi30k/ct2-int8 --quantization int8
  attnkit translate --engine ctranslate2 --checkpoint runs/multi30k/ct2 --input test.de --beam 5"""


def cmd_export(args, overrides: list[str]) -> None:
    """The checkpoint's header, the output folder and the ctranslate2 package are checked before the weights load."""
    from attnkit.checkpoint import check_checkpoint
    from attnkit.io import ensure_new_output

    if len(args.checkpoint) > 1:
        raise AttnkitError(f"export: a CTranslate2 model is one network, not an ensemble of {len(args.checkpoint)} "
                           "checkpoints: average their weights into one first (attnkit average CKPT ... --out "
                           "avg.safetensors) and export that")
    (checkpoint,) = args.checkpoint
    check_checkpoint(checkpoint)
    ensure_new_output(args.out, args.force, "output folder")
    from attnkit.export.ctranslate2 import export_checkpoint, require_ctranslate2  # imports torch

    require_ctranslate2()
    out = export_checkpoint(checkpoint, args.out, args.quantization, force=args.force)
    size = (out / "model.bin").stat().st_size / 2**20
    print(f"wrote {out} (CTranslate2, {args.quantization or 'float32'} weights, model.bin {size:.1f} MiB); "
          f"translate with: attnkit translate --engine ctranslate2 --checkpoint {out}")
