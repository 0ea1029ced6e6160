"""`attnkit export`: a trained Transformer as a model for another engine or library (CTranslate2, Hugging Face)."""

from __future__ import annotations

from collections.abc import Callable

from attnkit.cli.options import add_checkpoint_option
from attnkit.errors import AttnkitError

# attnkit.formats.ctranslate2.QUANTIZATIONS, spelled out here so that `--help` imports neither torch nor ctranslate2
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16")
FORMATS = ("ctranslate2", "huggingface")


def add_parsers(sub) -> dict[str, Callable]:
    ex = sub.add_parser("export", help="write a Transformer checkpoint as a CTranslate2 or Hugging Face model folder",
                        description=EXPORT_DESCRIPTION)
    ex.add_argument("--format", choices=FORMATS, default="ctranslate2",
                    help="ctranslate2: a CTranslate2 model (OpenNMT's C++ engine; pip install ctranslate2); "
                         "huggingface: a MarianMTModel folder as save_pretrained writes it (transformers reads it, "
                         "MarianTokenizer included)")
    add_checkpoint_option(ex, nargs="+", metavar="CKPT",
                          help="a .safetensors checkpoint written by attnkit (one: an exported model is one network; "
                               "several are refused, `attnkit average` makes them one)")
    ex.add_argument("--out", required=True, help="the model folder to write (with the tokenizer)")
    ex.add_argument("--quantization", choices=QUANTIZATIONS,
                    help="ctranslate2: store the weights in this type (int8: about 4x smaller; default: float32 as "
                         "trained)")
    ex.add_argument("--force", action="store_true", help="replace an existing model folder")
    return {"export": cmd_export}


EXPORT_DESCRIPTION = """\
Write a Transformer checkpoint as a model folder for another engine or library.

ctranslate2: the weights, the vocabulary, the sentencepiece model and attnkit.json (the tokenizer and
decoding defaults that go with it); then `attnkit translate --engine ctranslate2 --checkpoint FOLDER`
translates with it as with the checkpoint.
huggingface: a MarianMTModel folder (config.json, model.safetensors, source.spm, target.spm,
vocab.json, tokenizer_config.json) that MarianMTModel.from_pretrained and MarianTokenizer read, for
post-LN models (docs/import.md says what Marian cannot express).
Transformer-XL language models and RNN encoder-decoders have no equivalent in either.

  attnkit export --checkpoint runs/multi30k/checkpoints/avg5.safetensors --out runs/multi30k/ct2
  attnkit export --checkpoint CKPT --out runs/multi30k/ct2-int8 --quantization int8
  attnkit translate --engine ctranslate2 --checkpoint runs/multi30k/ct2 --input test.de --beam 5
  attnkit export --format huggingface --checkpoint CKPT --out runs/multi30k/hf"""


def cmd_export(args, overrides: list[str]) -> None:
    """The checkpoint's header, the output folder and the ctranslate2 package are checked before the weights load."""
    from attnkit.checkpoint import check_checkpoint
    from attnkit.io import ensure_new_output

    if len(args.checkpoint) > 1:
        raise AttnkitError(f"export: an exported model is one network, not an ensemble of {len(args.checkpoint)} "
                           "checkpoints: average their weights into one first (attnkit average CKPT ... --out "
                           "avg.safetensors) and export that")
    (checkpoint,) = args.checkpoint
    check_checkpoint(checkpoint)
    ensure_new_output(args.out, args.force, "output folder")
    if args.format == "huggingface":
        if args.quantization:
            raise AttnkitError("--quantization is CTranslate2's: a Hugging Face export keeps the float32 weights")
        from attnkit.formats import export_marian  # imports torch

        out = export_marian(checkpoint, args.out, force=args.force)
        size = (out / "model.safetensors").stat().st_size / 2**20
        print(f"wrote {out} (Hugging Face MarianMTModel, model.safetensors {size:.1f} MiB); load it with "
              f"MarianMTModel.from_pretrained and MarianTokenizer.from_pretrained, or import it back with: "
              f"attnkit import --from marian {out} --out MODEL.safetensors")
        return
    from attnkit.formats.ctranslate2 import export_checkpoint, require_ctranslate2  # imports torch

    require_ctranslate2()
    out = export_checkpoint(checkpoint, args.out, args.quantization, force=args.force)
    size = (out / "model.bin").stat().st_size / 2**20
    print(f"wrote {out} (CTranslate2, {args.quantization or 'float32'} weights, model.bin {size:.1f} MiB); "
          f"translate with: attnkit translate --engine ctranslate2 --checkpoint {out}")
