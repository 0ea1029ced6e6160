"""`attnkit translate | score | evaluate | serve`: using a trained translation model."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from attnkit.cli.options import (
    add_checkpoint_option,
    add_decode_options,
    add_device_option,
    add_quantize_option,
    decode_options,
)
from attnkit.errors import AttnkitError, ConfigError, DataError
from attnkit.io import atomic_write_text, ensure_new_output


def add_parsers(sub) -> dict[str, Callable]:
    tr = sub.add_parser("translate", help="translate text with a checkpoint: greedy, beam search or sampling",
                        description=TRANSLATE_DESCRIPTION)
    tr.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(tr, nargs="+", metavar="CKPT", help=ENSEMBLE_HELP)
    tr.add_argument("--engine", choices=["attnkit", "ctranslate2"], default="attnkit",
                    help="attnkit: PyTorch, with the checkpoint; ctranslate2: CTranslate2 (pip install ctranslate2), "
                         "with --checkpoint naming a folder written by `attnkit export` (same output formats and "
                         "scores; no --sampling, --prefix-file, or alignments of a layer other than the last; "
                         "--quantize int8 = its int8 compute type)")
    tr.add_argument("--input", default="-", help="file (plain or .gz), or - for stdin (one sentence per line)")
    tr.add_argument("--output", default="-", help="file, or - for stdout")
    tr.add_argument("--document", action="store_true",
                    help="the input is a document, not a sentence a line: each line is split into sentences (pysbd; "
                         "Chinese and Japanese by their punctuation), and the translations keep its lines, blank "
                         "lines and spaces")
    tr.add_argument("--force", action="store_true", help="overwrite an existing output file")
    tr.add_argument("--interactive", action="store_true", help="read a line, answer at once, until EOF")
    tr.add_argument("--format", choices=["text", "tsv"], default="text",
                    help="text: one translation per line; tsv: a header line, then line (from 1), rank (from 1), "
                         "score, normalised score, translation")
    tr.add_argument("--print-alignment", action="store_true",
                    help="add three tab-separated fields: the source pieces, the target pieces, and pairs "
                         "S-T (both counted from 1) linking each target piece T to the source piece S it attends "
                         "to most (cross-attention, heads averaged)")
    tr.add_argument("--alignment-layer", type=int, default=0, metavar="N",
                    help="decoder layer for --print-alignment, counted from 1 (default: the last)")
    tr.add_argument("--prefix-file", help="force each output to start with this file's line")
    tr.add_argument("--glossary", metavar="TSV",
                    help="source term<TAB>target term per line: where a source holds a source term (whole words, "
                         "case ignored; anywhere in Chinese or Japanese), its translation uses the target term "
                         "(constrained beam search, beam at least 5); a term that cannot be placed is reported")
    tr.add_argument("--glossary-inflected", action="store_true",
                    help="a glossary term's words also match with up to three more letters (dog: dogs)")
    add_target_tag_option(tr)
    add_decode_options(tr)
    tr.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    tr.add_argument("--max-tokens", type=int, default=0, help="source tokens per batch (0 = no limit)")
    add_device_option(tr)
    add_quantize_option(tr)

    sc = sub.add_parser("score", help="forced decoding: log P(target | source) for each line pair")
    sc.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(sc, nargs="+", metavar="CKPT", help=ENSEMBLE_HELP)
    sc.add_argument("--src", required=True, help="source file")
    sc.add_argument("--tgt", required=True, help="target file, line-aligned with --src")
    add_target_tag_option(sc)
    add_device_option(sc)

    sv = sub.add_parser("serve", help="an HTTP service: translation (JSON) or a language model (streamed samples), "
                                      "with the attention explorer at / (FastAPI + uvicorn; extra 'serve')")
    sv.set_defaults(keeps_freed_memory=True)
    add_checkpoint_option(sv, nargs="+", metavar="CKPT",
                          help=ENSEMBLE_HELP + "; the explorer at / draws the mean of the members' attention (the "
                               "first member's where their kinds, layers or heads differ). A language model is served "
                               "alone")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    sv.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    add_target_tag_option(sv)
    add_device_option(sv)
    add_quantize_option(sv)
    # no defaults here: create_app's apply, and a language model's service is told only of those given, to refuse
    sv.add_argument("--max-batch-sentences", type=int, help="sentences translated together (default: 64; "
                                                            "translation only: a language model samples one "
                                                            "request at a time)")
    sv.add_argument("--batch-wait-ms", type=float, help="how long to gather concurrent requests (default: 5; "
                                                        "translation only)")
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

    add_evaluate(sub)
    return {"translate": cmd_translate, "score": cmd_score, "serve": cmd_serve, "evaluate": cmd_evaluate}


def add_evaluate(sub) -> None:
    """The evaluate verb: scores of a hypothesis file, and --compare against another."""
    e = sub.add_parser("evaluate", help="sacreBLEU (cased + lowercased), chrF, chrF++ and TER of a hypothesis file; "
                                        "--compare: paired bootstrap against another system's",
                       description="BLEU tokenised for the target language (zh for Chinese, ja-mecab / ko-mecab "
                                   "where installed, 13a otherwise): --tgt-lang, else the references' script "
                                   "decides; --tokenize overrides. Prints sacreBLEU's signatures and the choice.")
    e.add_argument("--hyp", required=True, help="the system's translations, one per line")
    e.add_argument("--ref", required=True, help="the reference translations, line-aligned with --hyp")
    e.add_argument("--tgt-lang", help="the references' language code (zh, ja, ko, en, ...); without it the "
                                      "references' script decides")
    e.add_argument("--tokenize", metavar="TOK", help="sacreBLEU's tokenizer whatever the language: 13a, zh, "
                                                     "ja-mecab, ko-mecab, char, intl or none")
    e.add_argument("--compare", metavar="OTHER", help="another system's translations of the same sources: BLEU and "
                                                      "chrF++ of both over paired bootstrap resamples, with p-values")
    e.add_argument("--bootstrap-samples", type=int, default=1000, help="resamples for --compare")


def add_target_tag_option(p) -> None:
    p.add_argument("--target-tag", metavar="TAG",
                   help="a multilingual model's target language, as its vocabulary's tag names it (cmn_Hans for "
                        ">>cmn_Hans<<; an unknown one is refused, listing those it knows): put before every source "
                        "that does not start with a tag of its own")


ENSEMBLE_HELP = ("a .safetensors checkpoint written by attnkit; several (e.g. a run's last epochs, "
                 "RUN/checkpoints/epoch*.safetensors) run as one model, an ensemble averaging their probabilities at "
                 "every step (same tokenizers)")
TRANSLATE_DESCRIPTION = """\
Translate sentences, one per line, with a checkpoint written by `attnkit train` or `attnkit demo`:

  echo "dreihundertfünfundvierzig" | attnkit translate --checkpoint runs/demo/checkpoints/best.safetensors
  attnkit translate --checkpoint CKPT --input test.de --output test.hyp --beam 5
  attnkit translate --checkpoint CKPT --input test.de --beam 5 --nbest 3 --format tsv
  attnkit translate --checkpoint RUN/checkpoints/epoch*.safetensors --input test.de --beam 5   # an ensemble
  attnkit translate --engine ctranslate2 --checkpoint CT2_FOLDER --input test.de --beam 5"""


def read_input(name: str) -> list[str]:
    """The lines of a file, or of stdin for "-"; either one empty is the same error."""
    from attnkit.data.text import iter_lines

    if name != "-":
        return file_lines(name, "--input")
    lines = list(iter_lines(sys.stdin))
    if not lines:  # no bytes at all: a single newline is one (empty) line
        raise DataError("<stdin> is empty")  # as read_lines says of an empty file
    return lines


def file_lines(name: str, option: str) -> list[str]:
    """The lines of the file `option` names; a folder is named as one (the reader would say "no such file", as of
    a name with nothing behind it): tests/test_cli.py."""
    from attnkit.data.text import read_lines

    if Path(name).is_dir():
        raise DataError(f"{option} {name} is a folder, not a file: give a file of sentences, one per line")
    return read_lines(name)


def cmd_translate(args, overrides: list[str]) -> None:
    """Every input is checked (and read) before the model loads, so a mistake costs no waiting."""
    from attnkit.data.text import iter_lines

    check_model(args)
    if args.output != "-":
        ensure_new_output(args.output, args.force, "output file")
    if args.alignment_layer < 0:
        raise AttnkitError(f"--alignment-layer counts decoder layers from 1; got {args.alignment_layer}")
    prefixes = file_lines(args.prefix_file, "--prefix-file") if args.prefix_file else None
    lines = None
    if not args.interactive:
        if args.input == "-" and sys.stdin.isatty():
            print("attnkit: reading sentences from the terminal, one per line; end with Ctrl-D "
                  "(--input FILE reads a file)", file=sys.stderr)
        lines = read_input(args.input)
        if prefixes is not None and len(prefixes) != len(lines):
            raise AttnkitError(f"--prefix-file has {len(prefixes)} lines but the input has {len(lines)}")
    opts = decode_options(args)
    check_document_options(args, opts)
    glossary = read_glossary(args)
    translator = load_translator(args)
    layers = translator.attention_layers
    if args.alignment_layer > layers:
        raise AttnkitError(f"--alignment-layer {args.alignment_layer}: the model has {layers} decoder layers")

    def render(batch: list[str], first: int = 0, prefixes: list[str] | None = None) -> str:
        results = translator.translate(batch, opts, prefixes=prefixes, batch_size=args.batch_size,
                                       max_tokens=args.max_tokens, need_attention=args.print_alignment,
                                       number_from=first + 1, glossary=glossary)  # warnings name the input's line
        return "".join(format_translation(first + i, t, args) for i, t in enumerate(results))

    if args.document:
        from attnkit.decode import translate_document

        src, tgt = document_languages(args)
        return write_output(args, translate_document(translator, "\n".join(lines), opts, lang=src, tgt_lang=tgt,
                                                      batch_size=args.batch_size, max_tokens=args.max_tokens,
                                                      glossary=glossary) + "\n")
    header = tsv_header(args) if args.format == "tsv" else ""
    if args.interactive:
        sys.stdout.write(header)
        for n, line in enumerate(iter_lines(sys.stdin)):
            sys.stdout.write(render([line], n))
            sys.stdout.flush()
        return
    write_output(args, header + render(lines, prefixes=prefixes))


def write_output(args, text: str) -> None:
    if args.output == "-":
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)


def check_document_options(args, opts) -> None:
    """--document writes the translated text alone: what would need a sentence a line is refused in one line."""
    if not args.document:
        return
    clashes = [name for name, given in (("--interactive", args.interactive), ("--prefix-file", args.prefix_file),
                                         ("--format tsv", args.format == "tsv"), ("--nbest", opts.nbest > 1),
                                         ("--print-alignment", args.print_alignment)) if given]
    if clashes:
        raise AttnkitError(f"--document writes the translated document alone; {', '.join(clashes)} needs a sentence "
                           "a line (leave --document out)")


def read_glossary(args):
    """--glossary's entries (None without one); attnkit's own search places them."""
    if not args.glossary:
        return None
    if args.engine == "ctranslate2":
        raise AttnkitError("--glossary runs with --engine attnkit (constrained beam search), not with CTranslate2")
    from attnkit.data.glossary import Glossary

    return Glossary.read(args.glossary, inflected=args.glossary_inflected)


def document_languages(args) -> tuple[str | None, str | None]:
    """The languages whose rules --document uses (sentences, joining a cut sentence's parts): the checkpoint's, as
    `attnkit prepare` recorded them."""
    from attnkit.checkpoint import checkpoint_languages

    if args.engine == "ctranslate2":
        return None, None
    languages = checkpoint_languages(args.checkpoint[0])
    return languages.get("src"), languages.get("tgt")


def check_model(args) -> None:
    """What can be checked of --checkpoint before anything slow: a checkpoint's header, or an export's files."""
    if args.engine == "ctranslate2":
        from attnkit.formats import check_export, require_ctranslate2

        if len(args.checkpoint) > 1:
            raise AttnkitError("--engine ctranslate2 translates with one export folder; ensembles of several "
                               "checkpoints run with --engine attnkit")
        check_export(args.checkpoint[0])
        require_ctranslate2()
        return
    from attnkit.checkpoint import check_checkpoint

    for path in args.checkpoint:
        if (Path(path) / "attnkit.json").is_file():
            raise AttnkitError(f"{path} is a CTranslate2 export: translate with it using --engine ctranslate2")
        check_checkpoint(path)


def load_translator(args):
    """The translator of --engine: attnkit's (PyTorch) for a checkpoint, CTranslate2's for an export folder; both
    answer `translate(sentences, options, ...)` with the same Translations."""
    if args.engine == "ctranslate2":
        if args.target_tag:
            raise AttnkitError("--target-tag runs with --engine attnkit, not with a CTranslate2 export")
        from attnkit.formats import CT2Translator

        return CT2Translator.from_dir(args.checkpoint[0], device=args.device,
                                      compute_type="int8" if args.quantize == "int8" else "default")
    from attnkit.decode import Translator  # here: the CLI imports torch only when a verb runs

    return Translator.from_checkpoints(args.checkpoint, device=args.device, quantize=args.quantize,
                                       target_tag=args.target_tag)


def tsv_header(args) -> str:
    fields = ["line", "rank", "score", "norm_score", "translation"]
    if args.print_alignment:
        fields += ["source_pieces", "target_pieces", "alignment"]
    return "\t".join(fields) + "\n"


def format_translation(index: int, t, args) -> str:
    """One line per hypothesis: plain text, or TSV with scores; lines and ranks counted from 1; alignments
    as `S-T` pairs of 1-based piece positions, next to the pieces they index."""
    out = []
    for rank, h in enumerate([t] + t.nbest, start=1):
        fields = [h.text] if args.format == "text" else [str(index + 1), str(rank), f"{h.score:.4f}",
                                                         f"{h.norm_score:.4f}", h.text]
        if args.print_alignment:
            fields += [" ".join(h.src_pieces), " ".join(h.tgt_pieces),
                       " ".join(f"{s + 1}-{j + 1}" for j, s in enumerate(h.alignment))]
        out.append("\t".join(fields) + "\n")
    return "".join(out)


def cmd_score(args, overrides: list[str]) -> None:
    from attnkit.checkpoint import check_checkpoint
    from attnkit.data import read_parallel
    from attnkit.decode import Translator

    for path in args.checkpoint:
        check_checkpoint(path)
    src, tgt = read_parallel(args.src, args.tgt)
    translator = Translator.from_checkpoints(args.checkpoint, device=args.device, target_tag=args.target_tag)
    for lp in translator.score(src, tgt):
        print(f"{lp:.4f}")


def cmd_serve(args, overrides: list[str]) -> None:
    try:
        from attnkit.serve import serve
    except ImportError as e:
        raise AttnkitError(str(e)) from None
    from attnkit.checkpoint import check_checkpoint

    for path in args.checkpoint:
        check_checkpoint(path)
    batching = {name: getattr(args, name) for name in ("max_batch_sentences", "batch_wait_ms")
                if getattr(args, name) is not None}  # only those given (a language model's service refuses them)
    serve(args.checkpoint, host=args.host, port=args.port, device=args.device, quantize=args.quantize, **batching,
          max_queue=args.max_queue, request_timeout_s=args.request_timeout_s, memory_budget_mb=args.memory_budget_mb,
          max_request_sentences=args.max_request_sentences, max_chars=args.max_chars, max_beam=args.max_beam,
          max_output_tokens=args.max_output_tokens, max_top_k=args.max_top_k, target_tag=args.target_tag)


def cmd_evaluate(args, overrides: list[str]) -> None:
    from attnkit.data import read_parallel
    from attnkit.eval import score_corpus
    from attnkit.eval.significance import extra_metrics, paired_bootstrap

    hyps, refs = read_parallel(args.hyp, args.ref)  # a lost or extra line: an error naming both files
    scores = score_corpus(hyps, refs, lang=args.tgt_lang, tokenize=args.tokenize)
    metrics = extra_metrics(scores.tokenizer)
    print(scores.summary())
    print(", ".join(f"{name} {metric.corpus_score(hyps, [refs]).score:.2f}" for name, metric in metrics.items()))
    print(scores.signatures())
    for name, metric in metrics.items():
        print(f"{name + ' signature:':16}{metric.get_signature()}")
    if args.compare:
        if args.bootstrap_samples < 1:
            raise ConfigError("--bootstrap-samples must be at least 1")
        other, _ = read_parallel(args.compare, args.ref)
        print(f"\npaired bootstrap, {args.bootstrap_samples} resamples of the {len(refs)} sentences (sacreBLEU; "
              f"p: how often a difference this large arises by chance): --hyp, then --compare, each score with its "
              f"bootstrap mean ± 95% interval")
        for row in paired_bootstrap(hyps, other, refs, scores.tokenizer, args.bootstrap_samples):
            print(row.line())
