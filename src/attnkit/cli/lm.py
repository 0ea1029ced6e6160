"""`attnkit lm prepare | train | eval | generate | speed`: language models (Transformer-XL, vanilla LM).

    attnkit lm prepare --train input.txt.gz --valid-fraction 0.1 --level char --out runs/shakespeare/data
    attnkit lm train --data runs/shakespeare/data --out runs/shakespeare/xl --config lm-char-small
    attnkit lm eval --checkpoint runs/shakespeare/xl/checkpoints/best.safetensors --data runs/shakespeare/data \
        --mem-len 256
    attnkit lm generate --checkpoint runs/shakespeare/xl/checkpoints/best.safetensors --prompt "ROMEO:"
    attnkit lm speed --lengths 128 256 512 1024
    attnkit lm speed --lengths 800 3800 --vanilla-tokens 32   # the Transformer-XL paper's table 9 lengths
    attnkit lm speed --lengths 800 3800 --vanilla-tokens 32 --recompute   # and XL timed as its reference runs

Torch and the model code are imported inside the command functions, so `attnkit --help` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from attnkit.cli.options import (
    add_checkpoint_option,
    add_config_option,
    add_device_option,
    add_overrides,
    add_sampling_options,
    add_train_options,
    text,
    train_config,
)
from attnkit.errors import AttnkitError

if TYPE_CHECKING:
    from attnkit.eval.lm import LMScores

DEFAULT_PRESET = "lm-char-small"


def add_parsers(sub) -> dict[str, Callable]:
    lm = sub.add_parser("lm", help="language models: prepare, train, eval, generate, speed (Transformer-XL, vanilla)")
    verbs = lm.add_subparsers(dest="lm_verb", required=True, metavar="LM_VERB")

    p = verbs.add_parser("prepare", help="learn a vocabulary and encode a text corpus into id streams")
    p.add_argument("--train", help="training text (plain or .gz); required unless --vocab-from gives the vocabulary")
    p.add_argument("--valid", help="validation text")
    p.add_argument("--test", help="test text")
    p.add_argument("--valid-fraction", type=float, default=0.0,
                   help="instead of --valid: hold out this final fraction of the training text (e.g. 0.1)")
    p.add_argument("--level", choices=["char", "word", "subword"],
                   help="char (default): every character; word: whitespace tokens + <eos> per line; subword: "
                        "sentencepiece; with --vocab-from, the checkpoint's level (another one is refused)")
    p.add_argument("--vocab-size", type=int, default=8000, help="subword level only")
    p.add_argument("--vocab-from", metavar="CHECKPOINT",
                   help="encode with this language model's vocabulary (and level) instead of learning one, so the "
                        "checkpoint (e.g. one `attnkit import` wrote) can be scored on the text")
    p.add_argument("--out", required=True, help="folder for corpus.safetensors")
    p.add_argument("--force", action="store_true", help="overwrite an existing output folder")

    t = verbs.add_parser("train", help="train a Transformer-XL or vanilla LM on a prepared corpus")
    add_train_options(t, "attnkit lm prepare", f"{DEFAULT_PRESET}; with --resume: the run's", "lm")

    e = verbs.add_parser("eval", help="loss, perplexity, bits per character and tokens/s of a checkpoint")
    e.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(e)
    e.add_argument("--data", required=True, help="prepared corpus folder")
    e.add_argument("--split", default="valid", choices=["train", "valid", "test"], help="which split to score")
    e.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval length)")
    e.add_argument("--mem-len", type=int, help="XL memory length (default: the run's eval memory)")
    e.add_argument("--clamp-len", type=int, help="clamp relative distances (default: the run's)")
    e.add_argument("--batch-size", type=int, default=1, help="parallel streams (1 = one continuous stream)")
    e.add_argument("--sliding-window", type=int, default=0, metavar="W",
                   help="also score with the Al-Rfou sliding window of W tokens (one prediction per window)")
    e.add_argument("--max-tokens", type=int, default=0, help="score only the first N tokens (0 = all)")
    e.add_argument("--cache", type=int, metavar="N",
                   help="also score with a continuous cache of the last N hidden states (Grave et al. 2017), its "
                        "theta and lambda chosen on the valid split (default: the run's train.eval_cache; 0 = none)")
    e.add_argument("--cache-theta", type=float, help="the cache's theta instead of choosing it on valid")
    e.add_argument("--cache-lambda", type=float, help="the cache's lambda instead of choosing it on valid")
    add_device_option(e)

    g = verbs.add_parser("generate", help="sample text, reading the prompt as the model was trained: memory "
                                          "carried in segments of its length, or a sliding window without memory")
    g.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(g)
    g.add_argument("--prompt", default="", type=text, help="text to continue (default: start of a line)")
    g.add_argument("--length", type=int, default=200, help="tokens to generate")
    g.add_argument("--mem-len", type=int,
                   help="memory to sample with (default: the run's eval memory; 0: a sliding window of the training "
                        "segment); for the vanilla LM its window, at most its training segment")
    add_sampling_options(g)
    add_device_option(g)

    s = verbs.add_parser("speed", help="per-token eval time: vanilla sliding window vs Transformer-XL, and the ratio")
    add_overrides(s)
    add_config_option(s, "lm-workload: d 256, 4 heads, FFN 1024, 4 layers, vocab 256")
    s.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024], help="attention lengths")
    s.add_argument("--runs", type=int, default=5, help="timed calls per measurement (median)")
    s.add_argument("--vanilla-tokens", type=int, default=0, metavar="N",
                   help="time the vanilla sliding window over N predicted tokens (N calls of one window: at 3,800 "
                        "each is a forward pass over 3,800 tokens) and Transformer-XL over --runs segments; the two "
                        "are timed in separate passes over the lengths (0: --runs calls for both, one pass)")
    s.add_argument("--recompute", action="store_true",
                   help="also time Transformer-XL as its reference evaluates: the memory's keys/values and the "
                        "position keys computed again every segment (attnkit keeps them); both speed-ups in one table")
    s.add_argument("--checkpoint", help="time this language model's architecture (one `attnkit import` wrote, say) "
                                        "instead of --config's; the vanilla LM is the same network with absolute "
                                        "positions (the weights do not change the time)")
    s.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    add_device_option(s, "cpu")
    return {"lm": cmd_lm}


def cmd_lm(args: argparse.Namespace, overrides: list[str]) -> None:
    {"prepare": cmd_prepare, "train": cmd_train, "eval": cmd_eval, "generate": cmd_generate,
     "speed": cmd_speed}[args.lm_verb](args, overrides)


def cmd_prepare(args, overrides: list[str]) -> None:
    from attnkit.data.lm import prepare_lm

    vocab = None
    if args.vocab_from:
        from attnkit.checkpoint import lm_vocab_of

        vocab = lm_vocab_of(args.vocab_from)
    elif not args.train:
        raise AttnkitError("lm prepare: give --train (the text to learn the vocabulary from) or --vocab-from")
    corpus = prepare_lm(args.out, args.train, args.valid, args.test, level=args.level, vocab_size=args.vocab_size,
                        valid_fraction=args.valid_fraction, force=args.force, vocab=vocab)
    print(corpus.summary())
    print(f"wrote {args.out}")


def cmd_train(args, overrides: list[str]) -> None:
    from attnkit import config as cfgmod
    from attnkit.train.lm_trainer import LMTrainer

    cfg = train_config(args, overrides, DEFAULT_PRESET, cls=cfgmod.LMRunConfig)
    if not isinstance(cfg, cfgmod.LMRunConfig):
        raise AttnkitError(f"the run in {args.out} trains a '{cfg.model.kind}' seq2seq model: continue it with "
                           "`attnkit train --resume`")
    trainer = LMTrainer(cfg, args.data, args.out, resume=args.resume, force=args.force, progress=not args.quiet,
                        change_recipe=args.change_recipe)
    metrics = trainer.fit()
    print(" | ".join(f"{k} {v:.4f}" for k, v in metrics.items()) or "no validation split: no metrics")
    print(f"checkpoints: {trainer.last_path.parent}")


def cmd_eval(args, overrides: list[str]) -> None:
    from attnkit.checkpoint import load_lm_checkpoint
    from attnkit.data.lm import load_lm_corpus
    from attnkit.errors import AttnkitError
    from attnkit.eval.lm import evaluate_segments, evaluate_sliding_window
    from attnkit.runtime import resolve_device

    device = resolve_device(args.device)
    model, vocab, cfg = load_lm_checkpoint(args.checkpoint, device)
    corpus = load_lm_corpus(args.data)
    if corpus.vocab.to_json() != vocab.to_json():
        raise AttnkitError(f"{args.data} was prepared with another vocabulary than {args.checkpoint} (prepare the "
                           f"text with `attnkit lm prepare --vocab-from {args.checkpoint}`)")
    if args.split not in corpus.splits:
        raise AttnkitError(f"{args.data} has no {args.split} split")
    ids, t = corpus.splits[args.split], cfg.train
    tgt_len, mem_len = t.eval_lengths
    tgt_len = args.tgt_len or tgt_len
    mem_len = mem_len if args.mem_len is None else args.mem_len
    clamp_len = t.clamp_len if args.clamp_len is None else args.clamp_len
    cache = t.eval_cache if args.cache is None else args.cache
    lengths = dict(tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len, ext_len=t.ext_len,
                   batch_size=args.batch_size, max_tokens=args.max_tokens, device=device)
    scores, cached = eval_with_cache(args, model, corpus, cache, lengths) if cache else \
        (evaluate_segments(model, ids, **lengths), "")
    memory = f", mem_len {mem_len}, clamp_len {clamp_len}" if model.attends_to_memory else ""
    memory += f", ext_len {t.ext_len}" if t.ext_len else ""
    print(f"{model.kind} on {args.split}, segments of {tgt_len}{memory}: {scores.summary()}")
    if cached:
        print(cached)
    if args.sliding_window:
        window = evaluate_sliding_window(model, ids, window=args.sliding_window, max_tokens=args.max_tokens,
                                         device=device)
        print(f"{model.kind} on {args.split}, sliding window of {args.sliding_window}: {window.summary()}")


def eval_with_cache(args, model, corpus, size: int, lengths: dict) -> tuple[LMScores, str]:
    """The --split scored without and with a cache of `size` states, its (theta, lambda) given or chosen on the
    valid split: (the model's scores, a line for the cache)."""
    from attnkit.eval.cache import evaluate_cache

    theta, lam, chosen = args.cache_theta, args.cache_lambda, ""
    if (theta is None) != (lam is None):
        raise AttnkitError("lm eval: give both --cache-theta and --cache-lambda, or neither (both chosen on valid)")
    if theta is None:
        if "valid" not in corpus.splits:
            raise AttnkitError(f"{args.data} has no valid split to choose the cache's theta and lambda on: give "
                               "--cache-theta and --cache-lambda")
        sweep = evaluate_cache(model, corpus.splits["valid"], size=size, **lengths)
        theta, lam = sweep.best()
        chosen = (f"; theta, lambda chosen on valid (ppl {sweep.static.ppl:.2f} without the cache, "
                  f"{sweep.scores(theta, lam).ppl:.2f} with it)")
    if args.split != "valid" or not chosen:
        sweep = evaluate_cache(model, corpus.splits[args.split], size=size, thetas=[theta], lambdas=[lam], **lengths)
    return sweep.static, (f"{model.kind} on {args.split} with a cache of {size} states (theta {theta}, lambda "
                          f"{lam}): {sweep.scores(theta, lam).summary()}{chosen}")


def cmd_generate(args, overrides: list[str]) -> None:
    from attnkit.checkpoint import load_lm_checkpoint
    from attnkit.decode.lm import sample_text
    from attnkit.runtime import resolve_device

    model, vocab, cfg = load_lm_checkpoint(args.checkpoint, resolve_device(args.device))
    print(args.prompt + sample_text(model, vocab, cfg, args.prompt, args.length, mem_len=args.mem_len,
                                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed))


def cmd_speed(args, overrides: list[str]) -> None:
    from dataclasses import replace

    import torch

    from attnkit import config as cfgmod
    from attnkit.bench.lm_speed import format_speed_table, speed_table

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = cfgmod.resolve(args.config, overrides, cls=cfgmod.LMRunConfig)
    if args.checkpoint:
        from attnkit.checkpoint import lm_config_of

        cfg = lm_config_of(args.checkpoint)
        if not isinstance(cfg.model, cfgmod.TransformerXLConfig):
            raise AttnkitError(f"lm speed times Transformer-XL against the vanilla LM; {args.checkpoint} holds a "
                               f"{cfg.model.kind}")
    if min(args.lengths) < 1 or args.runs < 1 or args.vanilla_tokens < 0:
        raise AttnkitError("lm speed: --lengths and --runs must be positive, --vanilla-tokens not negative")
    rows = speed_table(cfg.model, tuple(args.lengths), runs=args.runs, device=args.device, recompute=args.recompute)
    if args.vanilla_tokens and args.vanilla_tokens != args.runs:  # speed_table times both with one count
        vanilla = speed_table(cfg.model, tuple(args.lengths), runs=args.vanilla_tokens, device=args.device)
        rows = [replace(row, vanilla_ms=v.vanilla_ms, peak_mb=max(row.peak_mb, v.peak_mb))
                for row, v in zip(rows, vanilla)]
    tokens = f"vanilla over {args.vanilla_tokens or args.runs} tokens, XL over {args.runs} segments"
    tokens += " (keys kept, and recomputed as the XL reference does)" if args.recompute else ""
    print(f"evaluation time per token, d_model {cfg.model.d_model}, {cfg.model.n_layers} layers, "
          f"{torch.get_num_threads()} threads, {args.device}; {tokens} per length (medians)")
    print(format_speed_table(rows))
