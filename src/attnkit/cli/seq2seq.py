"""`attnkit demo | prepare | train | average`: the seq2seq workflow from a parallel corpus to a checkpoint."""

from __future__ import annotations

from collections.abc import Callable

from attnkit.cli.options import add_overrides, add_train_options, add_trust_option, train_config
from attnkit.errors import AttnkitError


def add_parsers(sub) -> dict[str, Callable]:
    d = sub.add_parser("demo", help="train and evaluate the built-in German->English number demo (10-16 min on "
                                    "2 CPU cores)",
                       description="Write a German->English corpus of number words (0 to 999,999), learn its "
                                   "subwords, train the `demo` preset for 1,310 updates (10 epochs, the learning "
                                   "rate falling to 0 over the last 40%; as many updates on any CPU, 10-16 minutes "
                                   "on 2 cores), translate the test set, "
                                   "score it and draw the cross-attention of one sentence. --lang zh: the same with "
                                   "Chinese numerals (三百四十五 -> three hundred and forty-five) and the `demo-zh` "
                                   "preset.")
    d.set_defaults(trains="translation")
    add_overrides(d)
    d.add_argument("--lang", choices=["de", "zh"], default="de",
                   help="source language: German number words, or Chinese numerals (zh)")
    d.add_argument("--out", help="run folder (default: runs/demo, or runs/demo-zh with --lang zh)")
    d.add_argument("--n-train", type=int, default=24000, help="training pairs to generate")
    d.add_argument("--n-eval", type=int, default=1000, help="dev pairs and test pairs to generate (each)")
    d.add_argument("--force", action="store_true", help="overwrite an existing demo folder")
    d.add_argument("--quiet", action="store_true", help="no progress bars")

    pr = sub.add_parser("prepare", help="train a sentencepiece vocabulary and encode a parallel corpus",
                        description="The suffixes --src / --tgt are the languages' codes: prepare records them, "
                                    "training copies them into the checkpoint, and BLEU is tokenised for the "
                                    "target language (zh: by character) wherever it is scored.")
    pr.add_argument("--src", required=True, help="source language suffix and code, e.g. de or zh")
    pr.add_argument("--tgt", required=True, help="target language suffix and code, e.g. en")
    pr.add_argument("--train", required=True, help="file prefix: PREFIX.SRC and PREFIX.TGT (or .gz)")
    pr.add_argument("--valid", help="dev set prefix")
    pr.add_argument("--test", help="test set prefix")
    pr.add_argument("--out", required=True, help="folder for the vocabulary and encoded splits")
    pr.add_argument("--vocab-size", type=int, default=8000, help="subword vocabulary size (sentencepiece)")
    pr.add_argument("--model-type", default="bpe", choices=["bpe", "unigram", "char", "word"],
                    help="sentencepiece model type")
    pr.add_argument("--separate-vocab", action="store_true",
                    help="one vocabulary per language (each --vocab-size), for scripts that share almost nothing")
    pr.add_argument("--normalization", choices=["nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"],
                    help="sentencepiece's normalization rule, kept in the tokenizer: nmt_nfkc turns fullwidth "
                         "，？！１２ into ,?!12; identity keeps the text as written (default: identity when --src or "
                         "--tgt is Chinese or Japanese, else nmt_nfkc)")
    pr.add_argument("--character-coverage", type=float, default=1.0,
                    help="share of the training characters the vocabulary covers, the rarest beyond it UNK "
                         "(1.0 keeps all; sentencepiece suggests 0.9995 for large character sets)")
    pr.add_argument("--max-src-len", type=int, default=256, help="drop training pairs longer than this")
    pr.add_argument("--max-tgt-len", type=int, default=256, help="drop training pairs whose target is longer")
    pr.add_argument("--tokenizer-from", metavar="CHECKPOINT",
                    help="encode with this checkpoint's tokenizers instead of training new ones (fine-tuning it: "
                         "train --init-from CHECKPOINT)")
    pr.add_argument("--force", action="store_true", help="overwrite an existing output folder")

    t = sub.add_parser("train", help="train a seq2seq model (Transformer, rnn-*) on a prepared corpus")
    add_train_options(t, "attnkit prepare", "transformer-small; with --init-from: finetune; with --resume: the "
                                            "run's", "translation")
    t.add_argument("--init-from", metavar="CHECKPOINT",
                   help="fine-tune: start from this translation checkpoint's weights and model (an attnkit run's or "
                        "an imported one), on data prepared with --tokenizer-from CHECKPOINT")

    av = sub.add_parser("average", help="average the weights of several checkpoints into a new one")
    av.add_argument("checkpoints", nargs="*", help="checkpoint files (or use --run and --last)")
    av.add_argument("--run", help="run folder whose epoch checkpoints to average")
    av.add_argument("--last", type=int, default=5, help="with --run: how many of the latest epochs")
    av.add_argument("--out", required=True, help="the averaged checkpoint to write")
    av.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_trust_option(av)

    return {"demo": cmd_demo, "prepare": cmd_prepare, "train": cmd_train, "average": cmd_average}


def cmd_demo(args, overrides: list[str]) -> None:
    from attnkit.demo import run_demo

    out = args.out or ("runs/demo" if args.lang == "de" else f"runs/demo-{args.lang}")
    result = run_demo(out, lang=args.lang, overrides=overrides, n_train=args.n_train, n_eval=args.n_eval,
                      force=args.force, progress=not args.quiet)
    print(f"\ntest set: {result.scores.summary()}")
    print(result.scores.signature)
    right = sum(hyp == ref for _, hyp, ref in result.samples)
    print(f"the README's examples (test sentences), {right} of {len(result.samples)} right:")
    for src, hyp, ref in result.samples:
        print(f"  {src}\n    -> {hyp}{'' if hyp == ref else f'   WRONG (reference: {ref})'}")
    print(f"attention heatmap: {result.heatmap}\ncheckpoint: {result.checkpoint}")


def cmd_prepare(args, overrides: list[str]) -> None:
    from attnkit.checkpoint import checkpoint_tokenizers
    from attnkit.data import prepare, resolve_prefix

    def pair(prefix: str | None):
        return None if prefix is None else (resolve_prefix(prefix, args.src), resolve_prefix(prefix, args.tgt))

    tokenizers = checkpoint_tokenizers(args.tokenizer_from) if args.tokenizer_from else None
    report = prepare(args.out, pair(args.train), pair(args.valid), pair(args.test), vocab_size=args.vocab_size,
                     joint=not args.separate_vocab, model_type=args.model_type, max_src_len=args.max_src_len,
                     max_tgt_len=args.max_tgt_len, force=args.force, src_lang=args.src, tgt_lang=args.tgt,
                     normalization=args.normalization, character_coverage=args.character_coverage,
                     tokenizers=tokenizers)
    print(report.summary())
    print(f"wrote {args.out}")


def cmd_train(args, overrides: list[str]) -> None:
    from attnkit import config as cfgmod
    from attnkit.train.trainer import Trainer

    if args.init_from:
        from attnkit.train.finetune import fine_tuning_config

        if args.resume:
            raise AttnkitError("--init-from starts a fine-tuning run; --resume continues one (its config names the "
                               "checkpoint it started from): give one of them")
        cfg = fine_tuning_config(args.init_from, args.config or ["finetune"], overrides)
    else:
        cfg = train_config(args, overrides, "transformer-small")
    if not isinstance(cfg, cfgmod.RunConfig):
        where = f"--config {' '.join(args.config)}" if args.config else f"the run in {args.out}"
        raise AttnkitError(f"{where} configures a '{cfg.model.kind}' language model: train it with `attnkit lm train`")
    trainer = Trainer(cfg, args.data, args.out, resume=args.resume, force=args.force, progress=not args.quiet,
                      change_recipe=args.change_recipe)
    metrics = trainer.fit()
    print(" | ".join(f"{k} {v:.3f}" for k, v in metrics.items()) or "no dev set: no metrics")
    print(f"checkpoints: {trainer.last_path.parent}")


def cmd_average(args, overrides: list[str]) -> None:
    from attnkit.checkpoint import average_checkpoints, epoch_checkpoints
    from attnkit.io import ensure_new_output

    ensure_new_output(args.out, args.force, "output file")
    paths = list(args.checkpoints) or (epoch_checkpoints(args.run)[-args.last :] if args.run else [])
    if not paths:
        raise AttnkitError("average: name checkpoint files, or --run DIR with epoch checkpoints")
    average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints into {args.out}: " + ", ".join(str(p) for p in paths))
