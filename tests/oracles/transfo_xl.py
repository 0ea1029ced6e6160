"""The oracle of tests/test_import_transformer_xl.py: Hugging Face's TransfoXLLMHeadModel (transformers 4.x, where it
lives as a deprecated model; transformers 5 dropped it), run by the interpreter of the environment .ci/run builds
for it (build/oracles/transformers4), never imported by attnkit.

    python transfo_xl.py CASE.json OUT_DIR

CASE.json: {"config": TransfoXLConfig's fields, "seed": int, "ids": [[...], ...] (B, N), "segment": T,
"safetensors": bool, "vocab": [symbols] or null}. Writes into OUT_DIR a `save_pretrained` folder (config.json,
model.safetensors or pytorch_model.bin, and with "vocab" the tokenizer's vocab.pkl, as TransfoXLTokenizer saves
it), and outputs.safetensors: for each segment s of T tokens, read with the memory carried from the previous
ones (it starts empty), `logprobs.s` (B, T, V) and `mems.s.l` (M, B, D) per layer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import TransfoXLConfig, TransfoXLLMHeadModel

_type_as = torch.Tensor.type_as


def _type_as_dtype(self: torch.Tensor, other: torch.Tensor | None = None, *, dtype: torch.dtype | None = None):
    """transformers 4.46's TransfoXLModel.forward makes its positions with `arange(..., dtype=int64).type_as(
    dtype=word_emb.dtype)`, a call torch 2.13 refuses; it means a cast to the embeddings' dtype, which this does."""
    return self.to(dtype) if other is None else _type_as(self, other)


torch.Tensor.type_as = _type_as_dtype  # this process only: it runs nothing but the oracle


def build(case: dict) -> TransfoXLLMHeadModel:
    torch.manual_seed(case["seed"])
    model = TransfoXLLMHeadModel(TransfoXLConfig(**case["config"])).eval()
    with torch.no_grad():  # no parameter at its tidy initial value (zero biases, unit gains) hides a mapping error
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def write_vocab(symbols: list[str], out: Path) -> None:
    from transformers import TransfoXLTokenizer

    listing = out / "symbols.txt"
    listing.write_text("".join(f"{s}\n" for s in symbols), encoding="utf-8")
    tok = TransfoXLTokenizer(vocab_file=str(listing), unk_token="<unk>", eos_token="<eos>")
    tok.save_pretrained(str(out))
    listing.unlink()


def run(model: TransfoXLLMHeadModel, ids: torch.Tensor, segment: int) -> dict[str, torch.Tensor]:
    c = model.config
    mems = [torch.zeros(0, ids.size(0), c.d_model) for _ in range(c.n_layer)]  # empty: init_mems would hold zeros
    outputs = {}
    with torch.no_grad():
        for s, start in enumerate(range(0, ids.size(1), segment)):
            out = model(input_ids=ids[:, start:start + segment], mems=mems)
            mems = out.mems
            outputs[f"logprobs.{s}"] = out.prediction_scores.contiguous()
            outputs.update({f"mems.{s}.{i}": m.contiguous() for i, m in enumerate(mems)})
    return outputs


def main() -> None:
    case = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    model = build(case)
    model.save_pretrained(str(out), safe_serialization=case["safetensors"])
    if case.get("vocab"):
        write_vocab(case["vocab"], out)
    save_file(run(model, torch.tensor(case["ids"]), case["segment"]), str(out / "outputs.safetensors"))


if __name__ == "__main__":
    main()
