"""`attnkit translate | score | evaluate | serve`: using a trained translation model."""

from __future__ import annotations

import sys
from collections.abc import Callable

from attnkit.cli.options import add_checkpoint_option, add_decode_options, decode_options
from attnkit.errors import AttnkitError


def add_parsers(sub) -> dict[str, Callable]:
    tr = sub.add_parser("translate", help="translate text with a checkpoint: greedy, beam search or sampling")
    tr.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(tr)
    tr.add_argument("--input", default="-", help="file (plain or .gz) or - for stdin")
    tr.add_argument("--output", default="-", help="file or - for stdout")
    tr.add_argument("--force", action="store_true", help="overwrite an existing output file")
    tr.add_argument("--interactive", action="store_true", help="read a line, answer at once, until EOF")
    tr.add_argument("--format", choices=["text", "tsv"], default="text",
                    help="text: one translation per line; tsv: line, rank, score, normalised score, text")
    tr.add_argument("--print-alignment", action="store_true",
                    help="append source-target index pairs (arg-max cross-attention) to each line")
    tr.add_argument("--alignment-layer", type=int, default=-1, help="decoder layer for alignments")
    tr.add_argument("--prefix-file", help="force each output to start with this file's line")
    add_decode_options(tr)
    tr.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    tr.add_argument("--max-tokens", type=int, default=0, help="source tokens per batch (0 = no limit)")
    tr.add_argument("--device", default="auto")

    sc = sub.add_parser("score", help="forced decoding: log P(target | source) for each line pair")
    sc.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(sc)
    sc.add_argument("--src", required=True, help="source file")
    sc.add_argument("--tgt", required=True, help="target file, line-aligned with --src")
    sc.add_argument("--device", default="auto")

    sv = sub.add_parser("serve", help="an HTTP JSON translation service (FastAPI + uvicorn; extra 'serve')")
    sv.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(sv)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--device", default="auto")
    sv.add_argument("--max-batch-sentences", type=int, default=64, help="sentences translated together")
    sv.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long to gather concurrent requests")
    sv.add_argument("--max-queue", type=int, default=256, help="requests waiting at most; more get 503 + Retry-After")
    sv.add_argument("--request-timeout-s", type=float, default=60.0, help="a request unanswered by then gets 504")
    sv.add_argument("--memory-budget-mb", type=float, help="memory per batch (default: half of what is available)")
    caps = sv.add_argument_group("what one request may ask (beyond: 413 for sizes, 422 for options)")
    caps.add_argument("--max-request-sentences", type=int, default=64, help="sentences per request")
    caps.add_argument("--max-chars", type=int, default=1000, help="characters per sentence")
    caps.add_argument("--max-beam", type=int, default=16, help="beam size, and n-best or samples per sentence")
    caps.add_argument("--max-output-tokens", type=int, default=256,
                      help="output tokens per sentence (also the default of the request's max_len)")
    caps.add_argument("--max-top-k", type=int, default=1000, help="top_k for sampling")

    e = sub.add_parser("evaluate", help="sacreBLEU (cased + lowercased) and chrF of a hypothesis file")
    e.add_argument("--hyp", required=True)
    e.add_argument("--ref", required=True)
    return {"translate": cmd_translate, "score": cmd_score, "serve": cmd_serve, "evaluate": cmd_evaluate}


def cmd_translate(args, overrides: list[str]) -> None:
    from attnkit.data import iter_lines, read_lines
    from attnkit.decode import Translator
    from attnkit.io import atomic_write_text, ensure_new_output

    if args.output != "-":
        ensure_new_output(args.output, args.force, "output file")
    opts = decode_options(args)
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    prefixes = read_lines(args.prefix_file) if args.prefix_file else None

    def render(lines: list[str], first: int = 0, prefixes: list[str] | None = None) -> str:
        results = translator.translate(lines, opts, prefixes=prefixes, batch_size=args.batch_size,
                                       max_tokens=args.max_tokens, need_attention=args.print_alignment)
        return "".join(format_translation(first + i, t, args) for i, t in enumerate(results))

    if args.interactive:
        for n, line in enumerate(iter_lines(sys.stdin)):
            sys.stdout.write(render([line], n))
            sys.stdout.flush()
        return
    lines = list(iter_lines(sys.stdin)) if args.input == "-" else read_lines(args.input)
    if prefixes is not None and len(prefixes) != len(lines):
        raise AttnkitError(f"--prefix-file has {len(prefixes)} lines but the input has {len(lines)}")
    text = render(lines, prefixes=prefixes)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)


def format_translation(index: int, t, args) -> str:
    """One line per hypothesis: plain text, or TSV with scores; alignments as `src-tgt` pairs."""
    out = []
    for rank, h in enumerate([t] + t.nbest):
        fields = [h.text] if args.format == "text" else [str(index), str(rank), f"{h.score:.4f}",
                                                         f"{h.norm_score:.4f}", h.text]
        if args.print_alignment:
            fields.append(" ".join(f"{s}-{j}" for j, s in enumerate(h.alignment)))
        out.append("\t".join(fields) + "\n")
    return "".join(out)


def cmd_score(args, overrides: list[str]) -> None:
    from attnkit.data import read_parallel
    from attnkit.decode import Translator

    src, tgt = read_parallel(args.src, args.tgt)
    for lp in Translator.from_checkpoint(args.checkpoint, device=args.device).score(src, tgt):
        print(f"{lp:.4f}")


def cmd_serve(args, overrides: list[str]) -> None:
    try:
        from attnkit.serve import serve
    except ImportError as e:
        raise AttnkitError(str(e)) from None
    serve(args.checkpoint, host=args.host, port=args.port, device=args.device,
          max_batch_sentences=args.max_batch_sentences, batch_wait_ms=args.batch_wait_ms, max_queue=args.max_queue,
          request_timeout_s=args.request_timeout_s, memory_budget_mb=args.memory_budget_mb,
          max_request_sentences=args.max_request_sentences, max_chars=args.max_chars, max_beam=args.max_beam,
          max_output_tokens=args.max_output_tokens, max_top_k=args.max_top_k)


def cmd_evaluate(args, overrides: list[str]) -> None:
    from attnkit.data import read_lines
    from attnkit.eval import score_corpus

    scores = score_corpus(read_lines(args.hyp), read_lines(args.ref))
    print(scores.summary())
    print(f"BLEU signature: {scores.signature}\nlowercased:     {scores.signature_lc}")
