"""`attnkit import`: a model trained elsewhere (a Marian / Hugging Face MarianMTModel folder) as an attnkit
checkpoint, which every verb then runs."""

from __future__ import annotations

from collections.abc import Callable

from attnkit.cli.options import add_trust_option
from attnkit.io import ensure_new_output

FORMATS = ("marian",)  # attnkit.formats' importers; the verb's --from choices


def add_parsers(sub) -> dict[str, Callable]:
    im = sub.add_parser("import", help="write a pretrained model (Marian / opus-mt) as an attnkit checkpoint",
                        description=IMPORT_DESCRIPTION)
    im.add_argument("--from", dest="source_format", choices=FORMATS, required=True,
                    help="the format SOURCE is in: marian, a Hugging Face MarianMTModel folder (config.json, "
                         "model.safetensors, source.spm, target.spm, vocab.json), such as the Helsinki-NLP opus-mt "
                         "models")
    im.add_argument("source", metavar="SOURCE",
                    help="the model's folder (or a file in it); a hub name such as Helsinki-NLP/opus-mt-zh-en is "
                         "read from the Hugging Face cache where huggingface_hub is installed (nothing is downloaded)")
    im.add_argument("--out", required=True, help="the .safetensors checkpoint to write")
    im.add_argument("--src-lang", help="the source language's code, recorded in the checkpoint (default: the one "
                                       "tokenizer_config.json names, if any)")
    im.add_argument("--tgt-lang", help="the target language's code (BLEU's tokenizer follows it: zh for Chinese)")
    im.add_argument("--force", action="store_true", help="replace an existing checkpoint")
    add_trust_option(im)
    return {"import": cmd_import}


IMPORT_DESCRIPTION = """\
Write a pretrained translation model as an ordinary attnkit checkpoint, its tokenizers inside, so that
translate, score, serve, plot attention, --quantize int8, export and ensembles run on it unchanged.
Nothing is downloaded: fetch the model first with the tool of your choice. docs/import.md tells how
the weights, positions and vocabulary map.

  hf download Helsinki-NLP/opus-mt-zh-en --local-dir opus-mt-zh-en
  attnkit import --from marian opus-mt-zh-en --out zh-en.safetensors --src-lang zh --tgt-lang en
  echo "我们明天见。" | attnkit translate --checkpoint zh-en.safetensors --beam 5
  attnkit translate --checkpoint en-mul.safetensors --target-tag cmn_Hans --input news.en   # multilingual"""


def cmd_import(args, overrides: list[str]) -> None:
    """The output is checked before anything is read; the model is read and mapped, then written atomically."""
    ensure_new_output(args.out, args.force, "output file")
    from attnkit.checkpoint import save_checkpoint
    from attnkit.data.tokenizer import SubwordTokenizer
    from attnkit.decode.translator import target_tags
    from attnkit.formats import import_marian  # imports torch

    ckpt = import_marian(args.source, src_lang=args.src_lang, tgt_lang=args.tgt_lang)
    save_checkpoint(args.out, ckpt)
    c = ckpt.config.model
    tags = sorted(target_tags(SubwordTokenizer.from_bytes(ckpt.tokenizers["src"])))
    shown = f"; target tags ({len(tags)}): {', '.join(tags[:6])}{', ...' if len(tags) > 6 else ''}" if tags else ""
    print(f"wrote {args.out} (a Transformer of {c.n_encoder_layers}+{c.n_decoder_layers} layers, d_model "
          f"{c.d_model}, {c.activation}, vocabulary {c.src_vocab_size}{shown}); translate with: attnkit translate "
          f"--checkpoint {args.out}")
