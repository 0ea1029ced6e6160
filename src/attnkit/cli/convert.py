"""`attnkit import`: a model trained elsewhere (a Marian / Hugging Face MarianMTModel folder, a fairseq Transformer, a
Transformer-XL of the reference code, NVIDIA's or Hugging Face's) as an attnkit checkpoint, which every verb then
runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from attnkit.cli.options import add_trust_option
from attnkit.io import ensure_new_output

FORMATS = ("marian", "fairseq", "transformer-xl")  # attnkit.formats' importers; the verb's --from choices


def add_parsers(sub) -> dict[str, Callable]:
    im = sub.add_parser("import", help="write a pretrained model (Marian / opus-mt, fairseq, Transformer-XL) as an "
                                       "attnkit checkpoint",
                        description=IMPORT_DESCRIPTION)
    im.add_argument("--from", dest="source_format", choices=FORMATS, required=True,
                    help="the format SOURCE is in: marian, a Hugging Face MarianMTModel folder (config.json, "
                         "model.safetensors, source.spm, target.spm, vocab.json), such as the Helsinki-NLP opus-mt "
                         "models, or a folder of Marian's own (model.*.bin or model.*.npz with its model.yml, "
                         "vocab.*.spm, optionally config*.yml), such as the Bergamot / Firefox models; fairseq, a "
                         "checkpoint of fairseq's transformer (checkpoint_best.pt, model.pt) with "
                         "its dict.SRC.txt / dict.TGT.txt and sentencepiece model or BPE codes; transformer-xl, a "
                         "language model of the Transformer-XL reference code, NVIDIA's or Hugging Face's "
                         "TransfoXLLMHeadModel (transfo-xl-wt103): a folder (config.json, model.safetensors or "
                         "pytorch_model.bin, vocab.pkl or vocab.txt) or a state dict file")
    im.add_argument("source", metavar="SOURCE",
                    help="the model's folder (or a file in it); a hub name such as Helsinki-NLP/opus-mt-zh-en is "
                         "read from the Hugging Face cache where huggingface_hub is installed (nothing is downloaded)")
    im.add_argument("--out", required=True, help="the .safetensors checkpoint to write")
    im.add_argument("--src-lang", help="the source language's code, recorded in the checkpoint (default: the one "
                                       "tokenizer_config.json names, if any)")
    im.add_argument("--tgt-lang", help="the target language's code (BLEU's tokenizer follows it: zh for Chinese)")
    im.add_argument("--vocab", help="transformer-xl: the vocabulary, where it is not beside the weights (vocab.txt: a "
                                    "symbol per line, id = line; vocab.pkl: Hugging Face's TransfoXLTokenizer's); "
                                    "fairseq: the folder holding dict.SRC.txt and dict.TGT.txt (the data-bin "
                                    "fairseq-preprocess wrote), where they are not beside the checkpoint")
    im.add_argument("--spm", help="fairseq: the sentencepiece model the text was split with, where it is not beside "
                                  "the checkpoint (sentencepiece.bpe.model, spm.model) nor named by its cfg.bpe")
    im.add_argument("--bpe-codes", help="fairseq: subword-nmt's BPE codes the text was split with, where they are not "
                                        "beside the checkpoint (bpecodes, code) nor named by its cfg.bpe")
    im.add_argument("--moses", action=argparse.BooleanOptionalAction, default=None,
                    help="fairseq with BPE codes: the text was Moses-tokenized first (sacremoses; default: as the "
                         "checkpoint's cfg.tokenizer says, and yes where it names none, as fairseq's hub reads its "
                         "released models); --no-moses: split at spaces only")
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
  attnkit translate --checkpoint en-mul.safetensors --target-tag cmn_Hans --input news.en   # multilingual
  attnkit import --from fairseq checkpoints/checkpoint_best.pt --vocab data-bin --spm spm.model \
      --out fairseq.safetensors --trust-checkpoint --src-lang zh --tgt-lang en
  attnkit import --from fairseq wmt16.en-de.joined-dict.transformer --out en-de.safetensors \
      --trust-checkpoint --src-lang en --tgt-lang de       # model.pt, dict.en.txt, dict.de.txt, bpecodes
  attnkit import --from transformer-xl transfo-xl-wt103 --out wt103.safetensors --trust-checkpoint
  attnkit lm generate --checkpoint wt103.safetensors --prompt "The castle"

Pickles (pytorch_model.bin, vocab.pkl, the reference's and fairseq's .pt files) are read only with
--trust-checkpoint, and then weights-only (vocab.pkl and fairseq's settings as plain data): nothing in them runs.
What comes out is safetensors."""


def cmd_import(args, overrides: list[str]) -> None:
    """The output is checked before anything is read; the model is read and mapped, then written atomically."""
    ensure_new_output(args.out, args.force, "output file")
    from attnkit.checkpoint import save_checkpoint

    if args.source_format == "transformer-xl":
        from attnkit.formats import import_transformer_xl  # imports torch

        ckpt = import_transformer_xl(args.source, vocab=args.vocab)
        save_checkpoint(args.out, ckpt)
        c, t = ckpt.config.model, ckpt.config.train
        print(f"wrote {args.out} (a Transformer-XL of {c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads, "
              f"vocabulary {c.vocab_size:,}{f', cutoffs {c.cutoffs}' if c.cutoffs else ''}; evaluated with segments "
              f"of {t.tgt_len}, memory {t.mem_len}{f', clamp_len {t.clamp_len}' if t.clamp_len else ''}"
              f"{', same_length' if c.same_length else ''}); try: attnkit lm generate --checkpoint {args.out}")
        return
    from attnkit.data.target_tags import target_tags
    from attnkit.data.tokenizer_kinds import tokenizer_from_bytes
    from attnkit.formats import import_fairseq, import_marian  # imports torch

    if args.source_format == "fairseq":
        ckpt = import_fairseq(args.source, vocab=args.vocab, spm=args.spm, bpe_codes=args.bpe_codes,
                              moses=args.moses, src_lang=args.src_lang, tgt_lang=args.tgt_lang)
    else:
        ckpt = import_marian(args.source, src_lang=args.src_lang, tgt_lang=args.tgt_lang)
    save_checkpoint(args.out, ckpt)
    c = ckpt.config.model
    tags = sorted(target_tags(tokenizer_from_bytes(ckpt.tokenizers["src"])))
    shown = f"; target tags ({len(tags)}): {', '.join(tags[:6])}{', ...' if len(tags) > 6 else ''}" if tags else ""
    print(f"wrote {args.out} (a Transformer of {c.n_encoder_layers}+{c.n_decoder_layers} layers, d_model "
          f"{c.d_model}, {c.activation}, vocabulary {c.src_vocab_size}{shown}); translate with: attnkit translate "
          f"--checkpoint {args.out}")
