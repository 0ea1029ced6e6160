"""Marian / Hugging Face MarianMTModel import and export (attnkit.formats.marian), with `transformers` as the oracle.

Import: tiny random MarianMTModels (every parameter drawn, the output bias too) give attnkit logits equal to
MarianMTModel's to 1e-4, greedy and beam search equal to its generate(), and tokenization equal to MarianTokenizer's;
the test that checks the logits fails when one mapping is changed (q and k swapped, the sinusoid's layout, the output
bias, the vocabulary's offset). Export: an attnkit Transformer written as a MarianMTModel folder is read back by
transformers with attnkit's logits, ids and greedy outputs, and imported back it is the same model.

The searches define the same thing under these settings: generate(num_beams=K, length_penalty=a,
early_stopping="never") ranks finished hypotheses by log-probability / (tokens with EOS)^a and stops when no running
one can beat the K-th, as attnkit's beam search with --lenpen a --len-style length does; both ban pad (Marian's
bad_words_ids) and take the 2K best continuations per step. max_new_tokens L + 1 with forced_eos_token_id is attnkit's
limit of L tokens (EOS forced after them); the outputs here end before it, where the two give a forced EOS other scores.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from attnkit import config as cfgmod
from attnkit.checkpoint import Checkpoint, model_from, save_checkpoint
from attnkit.config import BOS_ID, EOS_ID, RNNConfig, RunConfig, TrainConfig, TransformerConfig
from attnkit.data.tokenizer import SubwordTokenizer
from attnkit.decode import DecodeOptions, Translator
from attnkit.errors import AttnkitError, ConfigError
from attnkit.formats import export_marian, import_marian, layer_names
from attnkit.formats import marian as marian_format
from attnkit.models import Transformer
from marian_models import PAIRS, SAMPLE, TAGS, TARGET_TEXT, in_vocab, load_marian, to_marian, write_marian

# MarianTokenizer asks for sacremoses, which it uses only in a method nothing here calls
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")]
LIMIT = 24  # output tokens in the search tests
VARIANTS = {  # write_marian's settings: the activations, both vocabulary layouts, untied and unscaled outputs
    "relu-no-bias": dict(activation="relu", bias=False),
    "swish-bias": dict(activation="swish"),
    "gelu-separate-vocabularies": dict(activation="gelu", share=False),
    "untied-unscaled": dict(tie=False, scale=False),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("marian")
    return {name: write_marian(root / name, **kw) for name, kw in VARIANTS.items()}


def to_attnkit(ckpt: Checkpoint, folder, side: str) -> dict[int, int]:
    """Marian id -> attnkit id, for the pieces vocab.json holds."""
    return {m: a for a, (m, ok) in enumerate(zip(to_marian(ckpt, folder, side), in_vocab(ckpt, folder, side))) if ok}


def logit_error(folder, ckpt: Checkpoint) -> float:
    """The largest difference between attnkit's logits and log-probabilities and MarianMTModel's, teacher-forced on
    MarianTokenizer's ids for SAMPLE -> TARGET_TEXT (attnkit's as one padded batch). Rows Marian has not (BOS, pieces
    vocab.json lacks) must take no probability."""
    hf, tok = load_marian(folder)
    src_map, tgt_map = to_attnkit(ckpt, folder, "src"), to_attnkit(ckpt, folder, "tgt")
    ours = model_from(ckpt, "imported").eval()
    pairs = [(tok(s)["input_ids"], tok(text_target=t)["input_ids"]) for s, t in zip(SAMPLE, TARGET_TEXT)]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor([src_map[i] for i in s]) for s, _ in pairs], batch_first=True)
    tgt_in = torch.nn.utils.rnn.pad_sequence([torch.tensor([BOS_ID, *(tgt_map[i] for i in t[:-1])]) for _, t in pairs],
                                             batch_first=True)
    with torch.no_grad():
        logits = ours.decode(tgt_in, ours.encode(src))[0]  # (B, T, V)
    rows = sorted(tgt_map.values())
    marian_ids = [next(m for m, a in tgt_map.items() if a == r) for r in rows]
    assert sorted(marian_ids) == list(range(hf.config.decoder_vocab_size))  # every Marian id is one attnkit row
    never = [r for r in range(logits.size(-1)) if r not in set(rows)]
    error = 0.0
    for i, (s, t) in enumerate(pairs):
        start = hf.config.decoder_start_token_id
        with torch.no_grad():
            theirs = hf(input_ids=torch.tensor([s]), decoder_input_ids=torch.tensor([[start, *t[:-1]]])).logits[0]
        mine = logits[i, : len(t)]
        error = max(error, (mine[:, rows] - theirs[:, marian_ids]).abs().max().item(),
                    (mine.log_softmax(-1)[:, rows] - theirs.log_softmax(-1)[:, marian_ids]).abs().max().item())
        assert mine.log_softmax(-1)[:, never].max() < -1000  # BOS and the pieces vocab.json lacks take no mass
    return error


@pytest.mark.parametrize("variant", VARIANTS)
def test_imported_logits_equal_marian_mt_models(folders, variant):
    ckpt = import_marian(folders[variant])
    assert logit_error(folders[variant], ckpt) < 1e-4
    c = ckpt.config.model
    assert (c.activation, c.output_bias) == (VARIANTS[variant].get("activation", "swish"), True)
    # one table where MarianMTModel has one: shared vocabularies with tied embeddings (untied, it keeps two)
    kw = VARIANTS[variant]
    assert c.share_embeddings == (kw.get("share", True) and kw.get("tie", True))


CORRUPTIONS = {
    # each changes one mapping; the logits test must then fail
    "q and k swapped": lambda mp: mp.setattr(layer_names, "_attention", lambda a, h: [
        (f"{a}.in_proj.weight", tuple(f"{h}.{p}_proj.weight" for p in "kqv"), layer_names.READS),
        (f"{a}.in_proj.bias", tuple(f"{h}.{p}_proj.bias" for p in "kqv"), layer_names.AS_IS),
        (f"{a}.out_proj.weight", (f"{h}.out_proj.weight",), layer_names.WRITES),
        (f"{a}.out_proj.bias", (f"{h}.out_proj.bias",), layer_names.WRITES)]),
    "sinusoid layout": lambda mp: mp.setattr(marian_format, "stream_order", lambda d: torch.arange(d)),
    "output bias": lambda mp: mp.setattr(marian_format, "_vocabulary_tensors", _without_bias(
        marian_format._vocabulary_tensors)),
    "vocabulary offset": lambda mp: mp.setattr(marian_format.Side, "table", lambda self, marian, order: marian[
        self.ids[1:] + self.ids[:1]][:, order]),
}


def _without_bias(mapped):
    def vocabulary_tensors(*args):
        out = mapped(*args)
        out["out_bias"] = torch.where(out["out_bias"] < marian_format.NEVER / 2, out["out_bias"], 0.0)
        return out
    return vocabulary_tensors


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_changed_mapping_fails_the_logits_test(folders, monkeypatch, corruption):
    CORRUPTIONS[corruption](monkeypatch)
    assert logit_error(folders["swish-bias"], import_marian(folders["swish-bias"])) > 1e-2


@pytest.fixture(scope="module")
def ending(tmp_path_factory):
    """A multilingual model (its vocabulary holds target-language tags) trained to translate PAIRS' sources, so that
    its outputs end by themselves, at several lengths."""
    folder = write_marian(tmp_path_factory.mktemp("ending") / "m", tags=TAGS, seed=3, memorize=120)
    ckpt = import_marian(folder)
    model = model_from(ckpt, "imported")
    src_tok = SubwordTokenizer.from_bytes(ckpt.tokenizers["src"])
    tgt_tok = SubwordTokenizer.from_bytes(ckpt.tokenizers.get("tgt", ckpt.tokenizers["src"]))
    return folder, ckpt, Translator(model, src_tok, tgt_tok, max_len_a=0.0, max_len_b=LIMIT)


def generated(hf, tok, sources: list[str], n: int, **kw) -> list[list[list[int]] | None]:
    """Per source, MarianMTModel.generate's n outputs without the start token, cut at EOS; None where one reached the
    length limit (there generate scores the EOS it forces as 0, attnkit by its log-probability)."""
    batch = tok(sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, max_new_tokens=LIMIT + 1, do_sample=False, num_return_sequences=n, **kw)
    rows = [seq[: seq.index(0)] if 0 in seq[:LIMIT] else None for seq in out[:, 1:].tolist()]  # Marian's EOS is 0
    per_source = [rows[i : i + n] for i in range(0, len(rows), n)]
    return [None if None in hyps else hyps for hyps in per_source]


@pytest.mark.parametrize("options", [dict(beam=1), dict(beam=4, len_penalty=1.0), dict(beam=4, len_penalty=0.0,
                                                                                          nbest=3)], ids=str)
def test_searches_equal_generate(ending, options):
    folder, ckpt, translator = ending
    hf, tok = load_marian(folder)
    sources = [s for s, _ in PAIRS]
    k, n = options["beam"], options.get("nbest", 1)
    theirs = generated(hf, tok, sources, n, num_beams=k,
                       **({} if k == 1 else dict(length_penalty=options["len_penalty"], early_stopping="never")))
    back = to_marian(ckpt, folder, "tgt")
    ours = translator.translate(sources, DecodeOptions(**options, len_style="length"))
    mine = [[[back[t] for t in h.tokens] for h in [r, *r.nbest]] for r in ours]
    compared = [(a, b) for a, b in zip(mine, theirs) if b is not None]
    assert len(compared) >= len(sources) * 2 // 3  # most outputs end before the limit
    assert [a for a, _ in compared] == [b for _, b in compared]
    assert len({len(h) for _, b in compared for h in b}) > 3  # outputs of several lengths: the stopping rules ran


TARGET_SAMPLE = [*TARGET_TEXT[:5], "The snowman ☃ sleeps in the garden.", "狗在公园。"]  # ☃: known to no spm


def test_tokenization_equals_marian_tokenizer(ending):
    folder, ckpt, translator = ending
    _, tok = load_marian(folder)
    src_back, tgt_back = to_marian(ckpt, folder, "src"), to_marian(ckpt, folder, "tgt")

    def ids(rows, back):
        return [[back[i] for i in [*row, EOS_ID]] for row in rows]

    assert ids(translator.encode_sources(SAMPLE), src_back) == tok(SAMPLE)["input_ids"]
    tagged = [f"{TAGS[1]} {s}" for s in SAMPLE]
    assert ids(translator.encode_sources(tagged), src_back) == tok(tagged)["input_ids"]  # a tag in the text
    translator.target_tag = "deu"  # the option: the same ids
    assert ids(translator.encode_sources(SAMPLE), src_back) == tok(tagged)["input_ids"]
    translator.target_tag = None
    targets = tok(text_target=TARGET_SAMPLE)["input_ids"]
    assert ids(translator.tgt_tok.encode(TARGET_SAMPLE), tgt_back) == targets
    # decoding: MarianTokenizer's text of the same ids, <unk> dropped as decode(skip_special_tokens=True) drops it
    mine = translator.tgt_tok.encode(TARGET_SAMPLE)
    assert translator.tgt_tok.decode(mine) == tok.batch_decode(targets, skip_special_tokens=True)
    assert tok.unk_token_id in sum(tok(SAMPLE)["input_ids"], [])  # the sample meets <unk> (the snowman, pieces dropped)


def test_an_unknown_target_tag_is_one_line_listing_the_known(ending):
    translator = ending[2]
    with pytest.raises(ConfigError) as e:
        translator.target_tag = "cmn_Hant"
    assert "\n" not in str(e.value) and "cmn_Hans" in str(e.value) and "did you mean 'cmn_Hans'" in str(e.value)


# --- export ---------------------------------------------------------------------------------------------------------
def attnkit_checkpoint(path, *, joint: bool = True, seed: int = 0, **model) -> Checkpoint:
    """A random attnkit Transformer with sentencepiece tokenizers of its own (attnkit's ids), saved at `path`."""
    src = SubwordTokenizer.train(SAMPLE * 3 + TARGET_TEXT * 3 if joint else SAMPLE * 3, 260 if joint else 160)
    tgt = src if joint else SubwordTokenizer.train(TARGET_TEXT * 3, 180)
    config = TransformerConfig(**{**dict(src_vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size, d_model=16,
                                         n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                                         share_embeddings=joint, max_positions=64), **model})
    torch.manual_seed(seed)
    net = Transformer.from_config(config)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.4)
    tokenizers = {"src": src.to_bytes()} if joint else {"src": src.to_bytes(), "tgt": tgt.to_bytes()}
    ckpt = Checkpoint("transformer", RunConfig(model=config, train=TrainConfig(max_len_a=0.0, max_len_b=LIMIT)),
                      net.state_dict(), tokenizers, languages={"src": "en", "tgt": "zh"})
    save_checkpoint(path, ckpt)
    return ckpt


EXPORTS = {
    "joint-relu": dict(),
    "separate-swish-bias-untied": dict(joint=False, activation="swish", output_bias=True, tie_output=False),
    "joint-gelu-bias": dict(activation="gelu", output_bias=True),
    "no-wo": dict(variant="no-wo"),  # W^O = I
}


@pytest.mark.parametrize("variant", EXPORTS)
def test_export_is_read_back_by_transformers(tmp_path, variant):
    ckpt = attnkit_checkpoint(tmp_path / "model.safetensors", **EXPORTS[variant])
    out = export_marian(tmp_path / "model.safetensors", tmp_path / "hf")
    hf, info = transformers_model(out)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _, tok = load_marian(out)
    translator = Translator.from_checkpoint(tmp_path / "model.safetensors", device="cpu")
    src = translator.encode_sources(SAMPLE)
    assert [[*s.tolist(), EOS_ID] for s in src] == tok(SAMPLE)["input_ids"]  # attnkit's ids are the export's
    assert [[*t, EOS_ID] for t in translator.tgt_tok.encode(TARGET_TEXT)] == tok(text_target=TARGET_TEXT)["input_ids"]
    model = model_from(ckpt, "attnkit").eval()
    for s, t in zip(SAMPLE, TARGET_TEXT):
        s_ids, t_ids = tok(s)["input_ids"], [BOS_ID, *translator.tgt_tok.encode([t])[0]]
        with torch.no_grad():
            theirs = hf(input_ids=torch.tensor([s_ids]), decoder_input_ids=torch.tensor([t_ids])).logits
            mine = model(torch.tensor([s_ids]), torch.tensor([t_ids]))
        assert (mine - theirs).abs().max() < 1e-4
    batch = tok(SAMPLE, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = hf.generate(**batch, max_new_tokens=LIMIT + 1, do_sample=False)[:, 1:].tolist()
    ours = translator.translate(SAMPLE)
    assert [h.tokens for h in ours] == [row[: row.index(EOS_ID)] if EOS_ID in row else row for row in theirs]
    assert [h.text for h in ours] == tok.batch_decode(theirs, skip_special_tokens=True)


def transformers_model(folder):
    from transformers import MarianMTModel

    model, info = MarianMTModel.from_pretrained(folder, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("output_bias", [True, False])
def test_export_then_import_is_the_same_model(tmp_path, output_bias):
    """The same tensors and config: a model without an output bias comes back without one (an all-zero
    final_logits_bias adds nothing), so its translations are the original's to the last bit."""
    ckpt = attnkit_checkpoint(tmp_path / "model.safetensors", joint=False, activation="swish", output_bias=output_bias)
    back = import_marian(export_marian(tmp_path / "model.safetensors", tmp_path / "hf"))
    assert back.config.model.output_bias is output_bias
    assert back.model_state.keys() == ckpt.model_state.keys()
    for name, tensor in ckpt.model_state.items():
        assert torch.equal(back.model_state[name], tensor), name
    for side in ("src", "tgt"):
        old, new = (SubwordTokenizer.from_bytes(c.tokenizers[side]) for c in (ckpt, back))
        assert old.pieces(list(range(old.vocab_size))) == new.pieces(list(range(new.vocab_size)))
        assert old.encode(SAMPLE) == new.encode(SAMPLE)
    assert back.languages == {"src": "en", "tgt": "zh"}
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["separate_vocabs"] is True


def test_a_failed_export_never_brings_back_a_folder_an_earlier_crash_left(tmp_path, monkeypatch):
    """A crash between moving the previous export aside and renaming the new one in leaves `.hf.old` and no `hf`; a
    later export whose rename fails must not put that stale folder back under `hf`'s name."""
    attnkit_checkpoint(tmp_path / "model.safetensors")
    (tmp_path / ".hf.old").mkdir()
    (tmp_path / ".hf.old" / "config.json").write_text("{}")
    replace = os.replace

    def failing_rename(src, dst):
        if Path(src).name.endswith(".tmp"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_rename)
    with pytest.raises(AttnkitError) as e:
        export_marian(tmp_path / "model.safetensors", tmp_path / "hf")
    assert str(e.value) == f"cannot write '{tmp_path / 'hf'}': Permission denied"
    assert not (tmp_path / "hf").exists() and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


@pytest.mark.parametrize("model,words", [
    (dict(norm_first=True), "pre-LN Transformer (model.norm_first)"),
    (dict(variant="kyubyong"), "(model.variant: kyubyong): LayerNorms of epsilon 1e-08 and dropout on the embeddings"),
    (dict(positions="learned"), "model.positions: learned"),
    (dict(positions="none"), "model.positions: none"),
    (dict(variant="no-ffn"), "model.variant: no-ffn: MarianMTModel's layers have every"),
    (dict(variant="shared-qk"), "model.variant: shared-qk: MarianMTModel's layers have every"),
], ids=str)
def test_export_refuses_what_marian_cannot_express(tmp_path, model, words):
    attnkit_checkpoint(tmp_path / "model.safetensors", **model)
    with pytest.raises(ConfigError) as e:
        export_marian(tmp_path / "model.safetensors", tmp_path / "hf")
    assert words in str(e.value) and "\n" not in str(e.value) and not (tmp_path / "hf").exists()


def test_export_refuses_other_families(tmp_path):
    for kind, words in (("transformer-xl", "Transformer-XL"), ("vanilla-lm", "language model"),
                        ("lstm-lm", "language model"), ("rnn-bahdanau", "RNN encoder-decoder")):
        run = cfgmod.family(kind).run
        config = run(model=RNNConfig(kind=kind)) if kind.startswith("rnn") else run()
        save_checkpoint(tmp_path / f"{kind}.safetensors", Checkpoint(kind, config, {}, {}))
        with pytest.raises(ConfigError, match=words):
            export_marian(tmp_path / f"{kind}.safetensors", tmp_path / kind)
