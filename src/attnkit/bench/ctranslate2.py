"""The MT decoding workloads through CTranslate2 (`pip install ctranslate2`, not an attnkit dependency).

CTranslate2 is OpenNMT's C++ inference engine, what people deploy translation models with on CPUs. Its
model is attnkit's Transformer at the workload's shape (random weights, post-LN, ReLU, sinusoidal
positions, one shared embedding table tied with the output projection) written by `attnkit export
--format ctranslate2` (`attnkit.formats.ctranslate2.save_ctranslate2`), so both engines run the same
network; variant "int8" loads it with `compute_type="int8"` (CTranslate2 quantises the weights at load
time, per row, and the activations per row and product). `intra_threads` is the workload's thread count,
and exactly N new tokens come from `min_decoding_length = max_decoding_length = N`.

Token strings: CTranslate2 takes strings, so id i is the string of i's vocabulary entry (`<pad>`, `<s>`,
`</s>`, `<unk>`, then `t4`, `t5`, ...); building the string batch is timed with the search, as a user's
call would be.

On the mt-opus-* workloads the model is CTranslate2's own conversion of the opus-mt-shape MarianMTModel
directory (bench.opus: `TransformersConverter`, quantization float32 or int8, as `ct2-transformers-converter`
makes it), loaded with the same compute type; its tokens are vocab.json's pieces (the converter drops <pad>:
CTranslate2 starts a Marian decoder from a zero vector and never produces it).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

import torch

from attnkit.bench import opus
from attnkit.bench.attnkit_adapter import attnkit_mt_build
from attnkit.bench.catalog import OPUS_WORKLOADS, version
from attnkit.bench.workloads import MTAdapter, MTShape, Toolkit, decoding_only

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3 as WORKLOADS.md has them


def vocabulary(size: int) -> list[str]:
    return SPECIALS + [f"t{i}" for i in range(len(SPECIALS), size)]


@dataclass
class Engine:
    """A loaded CTranslate2 translator and what the tables report about it."""

    translator: object  # ctranslate2.Translator
    vocab: list[str]
    index: dict[str, int]
    params: int

    def eval(self) -> Engine:
        return self


def ct2_build(compute_type: str):
    def build(s: MTShape) -> Engine:
        import ctranslate2

        from attnkit.formats.ctranslate2 import save_ctranslate2

        model, vocab = attnkit_mt_build(s).eval(), vocabulary(s.vocab)
        folder = tempfile.mkdtemp(prefix="attnkit-bench-ct2-")
        try:
            save_ctranslate2(model, vocab, vocab, f"{folder}/model")
            translator = ctranslate2.Translator(f"{folder}/model", device="cpu", compute_type=compute_type,
                                                intra_threads=torch.get_num_threads(), inter_threads=1)
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the translator holds its weights in memory
        params = sum(p.numel() for p in model.parameters())
        del model
        return Engine(translator, vocab, {t: i for i, t in enumerate(vocab)}, params)

    return build


def ct2_marian_build(compute_type: str):
    def build(s: MTShape) -> Engine:
        import ctranslate2

        folder = opus.ensure(s, [f"ct2-{compute_type}"])[f"ct2-{compute_type}"]
        hf = opus.part_path(s, "hf")
        vocab = opus.marian_vocab(hf)  # Marian id -> piece
        translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type,
                                            intra_threads=torch.get_num_threads(), inter_threads=1)
        return Engine(translator, vocab, {t: i for i, t in enumerate(vocab)}, opus.directory_params(hf))

    return build


def ct2_generate(engine: Engine, src: torch.Tensor, beam: int, n_new: int) -> torch.Tensor:
    """Exactly n_new tokens per source: (B, S) ids -> (B, n_new) ids."""
    batch = [[engine.vocab[i] for i in row] for row in src.tolist()]
    results = engine.translator.translate_batch(batch, beam_size=beam, min_decoding_length=n_new,
                                                max_decoding_length=n_new, length_penalty=1.0)
    return torch.tensor([[engine.index[t] for t in r.hypotheses[0]] for r in results])


NOTES = {"float32": "attnkit's Transformer exported to CTranslate2 (post-LN, ReLU, sinusoidal positions, tied)",
         "int8": "the same export, loaded with compute_type int8 (weights and activations quantised per row)"}
MARIAN_NOTES = {
    "float32": "the MarianMTModel directory converted by CTranslate2's TransformersConverter (float32), decoding "
               "from a zero vector, <pad> not in its vocabulary; min_decoding_length = max_decoding_length = T",
    "int8": "the directory converted by TransformersConverter with quantization int8, loaded with compute_type "
            "int8; min_decoding_length = max_decoding_length = T"}


def toolkit(variant: str = "float32") -> Toolkit:
    compute_type = variant or "float32"
    adapter = MTAdapter(ct2_build(compute_type), decoding_only, ct2_generate, NOTES[compute_type])
    marian = MTAdapter(ct2_marian_build(compute_type), decoding_only, ct2_generate, MARIAN_NOTES[compute_type])
    why = opus.unavailable(f"ct2-{compute_type}")
    return Toolkit("ctranslate2" if compute_type == "float32" else "ctranslate2-int8", version("ctranslate2"),
                   adapter, missing={"mt-train": "an inference engine: no training",
                                     **{w: why for w in OPUS_WORKLOADS if why}}, marian=marian)
