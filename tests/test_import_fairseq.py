"""fairseq import (attnkit.formats.fairseq), with fairseq's own Transformer as the oracle.

fairseq-fixed 0.12.3.1 runs from its source in build/oracles/fairseq (`make oracles` builds it beside this project's
environment); tests/oracles/fairseq_transformer.py builds tiny random models there with fairseq's own argument
parser, task and model classes, saves them as fairseq's trainer does, and scores and greedily decodes sentences of
the test corpus, split by a sentencepiece model into fairseq's dictionary ids. Imported, attnkit gives the same
log-probability to every target token (to 1e-4) and the same greedy outputs, for post-LN with shared tables,
pre-LN with GELU and separate tables, and unscaled embeddings with a tied output; the check fails when one mapping
is changed (attnkit's sinusoid for fairseq's, positions counted from 0).
What attnkit cannot express is refused in one line, and malformed dictionaries are named by file and line. Among
those are fairseq models whose encoder and decoder place their LayerNorms differently, or whose pre-LN decoder has
no final LayerNorm (attnkit's Transformer has one placement for both stacks, each pre-LN one ending with a
LayerNorm): each is refused by its settings, and, its settings stripped, by the final LayerNorms its weights hold.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint import load_checkpoint, save_checkpoint
from attnkit.cli.main import main
from attnkit.config import BOS_ID, EOS_ID, UNK_ID
from attnkit.data import SubwordTokenizer, read_lines
from attnkit.decode import Translator
from attnkit.errors import CheckpointError
from attnkit.formats import fairseq as fairseq_format
from attnkit.formats import import_fairseq
from attnkit.io import trust_pickle
from attnkit.models import Transformer

ORACLE = Path(__file__).resolve().parents[1] / "build" / "oracles" / "fairseq" / "bin" / "python"
SCRIPT = Path(__file__).resolve().parent / "oracles" / "fairseq_transformer.py"
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not ORACLE.exists(), reason="the oracle, fairseq 0.12 in build/oracles/fairseq, is "
                                 "not installed (make oracles installs it)")]

SIZES = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
         "--encoder-ffn-embed-dim", "24", "--decoder-ffn-embed-dim", "24", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--dropout", "0", "--max-source-positions", "64",
         "--max-target-positions", "64"]
CASES = {
    "post-LN, one table for both sides and the output": ["--share-all-embeddings"],
    "pre-LN, GELU, separate tables, untied output": ["--encoder-normalize-before", "--decoder-normalize-before",
                                                      "--activation-fn", "gelu"],
    "unscaled embeddings, output tied to the decoder's": ["--no-scale-embedding", "--share-decoder-input-output-embed"],
}
# fairseq models attnkit's Transformer cannot express: the options, the words the refusal names, and those it names
# when the checkpoint lacks the placement settings (read from the final LayerNorms the weights hold)
ENCODER_PRE = ("the encoder ends with a final LayerNorm (encoder.layer_norm: pre-LN) but the decoder lacks a final "
               "LayerNorm (decoder.layer_norm: post-LN)")
DECODER_PRE = ("the encoder lacks a final LayerNorm (encoder.layer_norm: post-LN) but the decoder ends with a final "
               "LayerNorm (decoder.layer_norm: pre-LN)")
REFUSED = {
    "pre-LN encoder, post-LN decoder": (["--encoder-normalize-before"],
                                        "encoder_normalize_before=True but decoder_normalize_before=False",
                                        ENCODER_PRE),
    "post-LN encoder, pre-LN decoder": (["--decoder-normalize-before"],
                                        "encoder_normalize_before=False but decoder_normalize_before=True",
                                        DECODER_PRE),
    "pre-LN, no final LayerNorm in the decoder": (["--encoder-normalize-before", "--decoder-normalize-before",
                                                   "--no-decoder-final-norm"], "no_decoder_final_norm=True",
                                                  ENCODER_PRE),
}
PLACEMENT = ("encoder_normalize_before", "decoder_normalize_before", "no_decoder_final_norm")  # what stripping drops
MAX_LEN = 12


def symbols(tok: SubwordTokenizer) -> list[str]:
    """dict.txt's symbols: the tokenizer's pieces in another order, a few left out (read as <unk>), and fairseq's
    padding to a multiple of 8."""
    pieces = tok.pieces(list(range(4, tok.vocab_size)))
    random.Random(0).shuffle(pieces)
    kept = pieces[: len(pieces) - 5]
    return kept + [f"madeupword{i:04d}" for i in range(-(len(kept) + 4) % 8)]


def fairseq_ids(tok: SubwordTokenizer, names: list[str], text: str) -> list[int]:
    index = {s: i + 4 for i, s in enumerate(names)}
    return [index.get(p, 3) for p in tok.pieces(tok.encode([text])[0])]


@pytest.fixture(scope="module")
def corpus(data_dir):
    tok = SubwordTokenizer.load(data_dir / "tokenizer.model")
    src, tgt = read_lines(data_dir / "valid.src.txt")[:6], read_lines(data_dir / "valid.tgt.txt")[:6]
    return tok, symbols(tok), list(zip(src, tgt))


def oracle_folder(folder: Path, extra: list[str], seed: int, corpus, data_dir: Path) -> tuple[Path, list[dict]]:
    """A folder holding fairseq's checkpoint of `extra`'s model, its dictionaries and the sentencepiece model, and
    what fairseq scores and decodes with it."""
    tok, names, pairs = corpus
    folder.mkdir()
    case = {"args": ["--arch", "transformer", *SIZES, *extra], "seed": seed, "symbols": names, "max_len_b": MAX_LEN,
            "pairs": [[fairseq_ids(tok, names, s), fairseq_ids(tok, names, t)] for s, t in pairs]}
    (folder / "case.json").write_text(json.dumps(case))
    done = subprocess.run([str(ORACLE), str(SCRIPT), str(folder / "case.json"), str(folder)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder / "spm.model").write_bytes((data_dir / "tokenizer.model").read_bytes())
    return folder, json.loads((folder / "outputs.json").read_text())


@pytest.fixture(scope="module")
def folders(tmp_path_factory, corpus, data_dir) -> dict[str, tuple[Path, list[dict]]]:
    root = tmp_path_factory.mktemp("fairseq")
    return {name: oracle_folder(root / f"case{i}", extra, i, corpus, data_dir)
            for i, (name, extra) in enumerate(CASES.items())}


@pytest.fixture(scope="module")
def refused_folders(tmp_path_factory, corpus, data_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fairseq-refused")
    return {name: oracle_folder(root / f"case{i}", extra, i, corpus, data_dir)[0]
            for i, (name, (extra, _, _)) in enumerate(REFUSED.items())}


def rewritten(folder: Path, dest: Path, change) -> Path:
    """A copy of `folder`'s checkpoint (cfg.model a dict) after `change(ckpt)`, saved in `dest` beside the folder's
    dictionaries and sentencepiece model."""
    ckpt = torch.load(folder / "checkpoint_best.pt", weights_only=False)
    copy = {**ckpt, "model": dict(ckpt["model"]), "cfg": {**ckpt["cfg"], "model": vars(ckpt["cfg"]["model"]).copy()}}
    change(copy)
    dest.mkdir(parents=True)
    torch.save(copy, dest / "model.pt")
    for name in ("dict.src.txt", "dict.tgt.txt", "spm.model"):
        (dest / name).write_bytes((folder / name).read_bytes())
    return dest


def stripped(ckpt: dict) -> None:
    """A checkpoint without the LayerNorm placement settings (as some tools strip them)."""
    for name in PLACEMENT:
        ckpt["cfg"]["model"].pop(name, None)


def imported(folder: Path, tmp_path: Path, **kw) -> Path:
    token = trust_pickle.set(True)  # a fairseq checkpoint is a pickle
    try:
        ckpt = import_fairseq(folder, **kw)
    finally:
        trust_pickle.reset(token)
    save_checkpoint(tmp_path / "fairseq.safetensors", ckpt)
    return tmp_path / "fairseq.safetensors"


def token_logprobs(path: Path, pairs: list[tuple[str, str]], known: int) -> list[torch.Tensor]:
    """Teacher-forced log P(token) of each target piece and EOS, one sentence at a time; a piece the dictionary
    lacks (a row past fairseq's `known` ids and attnkit's BOS) is scored as <unk>, as fairseq reads it."""
    ckpt = load_checkpoint(path)
    model = Transformer(ckpt.config.model).eval()
    model.load_state_dict(ckpt.model_state)
    tok = SubwordTokenizer.from_bytes(ckpt.tokenizers["src"])
    tgt_tok = SubwordTokenizer.from_bytes(ckpt.tokenizers.get("tgt", ckpt.tokenizers["src"]))
    rows = []
    for s, t in pairs:
        src = torch.tensor([tok.encode([s])[0] + [EOS_ID]])
        y = tgt_tok.encode([t])[0]
        with torch.no_grad():
            logp = model(src, torch.tensor([[BOS_ID] + y])).log_softmax(-1)[0]  # (T, V)
        out = torch.tensor([UNK_ID if i > known else i for i in y] + [EOS_ID])
        rows.append(logp[torch.arange(len(y) + 1), out])
    return rows


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_imported_models_score_and_decode_as_fairseq(folders, corpus, case, tmp_path):
    folder, expected = folders[case]
    _, names, pairs = corpus
    path = imported(folder, tmp_path, spm=folder / "spm.model")
    for ours, theirs in zip(token_logprobs(path, pairs, len(names) + 4), expected):
        torch.testing.assert_close(ours, torch.tensor(theirs["target_logprobs"]), atol=1e-4, rtol=1e-4)
    translator = Translator.from_checkpoint(path, device="cpu")
    out = translator.translate([s for s, _ in pairs], beam=1, max_len_a=0.0, max_len_b=MAX_LEN, min_len=1)
    table = ["<s>", "<pad>", "</s>", "<unk>", *names]
    for ours, theirs in zip(out, expected):
        assert ours.tgt_pieces == [table[i] for i in theirs["greedy"][:-1]]  # fairseq's ends with </s>


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_a_mixed_placement_is_refused_in_one_line(refused_folders, case, tmp_path):
    """fairseq's own model with each stack's LayerNorm placement set apart: refused by the setting that says so,
    never imported as another network (a post-LN encoder read as both, dropping the decoder's final LayerNorm)."""
    with pytest.raises(CheckpointError) as e:
        imported(refused_folders[case], tmp_path)
    words = REFUSED[case][1]
    assert words in str(e.value) and "\n" not in str(e.value)
    assert "truncated" not in str(e.value)  # not mistaken for a checkpoint missing a tensor


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_a_stripped_mixed_placement_is_refused_by_its_weights(refused_folders, case, tmp_path):
    """Without the settings, both stacks' placements are read from the final LayerNorms the weights hold: one
    stack holding one and the other not is refused in one line naming both."""
    path = rewritten(refused_folders[case], tmp_path / "stripped", stripped)
    with pytest.raises(CheckpointError) as e:
        imported(path, tmp_path)
    assert REFUSED[case][2] in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("case", list(CASES)[:2], ids=list(CASES)[:2])
def test_a_stripped_uniform_placement_scores_as_fairseq(folders, corpus, case, tmp_path):
    """Post-LN and pre-LN models stripped of their placement settings import from their weights, as fairseq
    scores them."""
    folder, expected = folders[case]
    path = imported(rewritten(folder, tmp_path / "stripped", stripped), tmp_path)
    for ours, theirs in zip(token_logprobs(path, corpus[2], len(corpus[1]) + 4), expected):
        torch.testing.assert_close(ours, torch.tensor(theirs["target_logprobs"]), atol=1e-4, rtol=1e-4)


def test_settings_that_contradict_the_weights_are_refused(folders, tmp_path):
    """A pre-LN model whose settings say post-LN: refused in one line, not read either way."""
    folder, _ = folders[list(CASES)[1]]

    def post_ln(ckpt: dict) -> None:
        ckpt["cfg"]["model"].update(encoder_normalize_before=False, decoder_normalize_before=False)

    with pytest.raises(CheckpointError) as e:
        imported(rewritten(folder, tmp_path / "contradicted", post_ln), tmp_path)
    assert "holds encoder.layer_norm.weight" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("wrong", ["attnkit's sinusoid", "positions from 0"])
def test_the_check_fails_when_a_mapping_is_changed(folders, corpus, tmp_path, monkeypatch, wrong):
    from attnkit.nn import sinusoid_table

    folder, expected = folders[next(iter(CASES))]
    if wrong == "attnkit's sinusoid":
        monkeypatch.setattr(fairseq_format, "fairseq_sinusoid", sinusoid_table)
    else:
        monkeypatch.setattr(fairseq_format, "PAD", -1)
    ours = token_logprobs(imported(folder, tmp_path, spm=folder / "spm.model"), corpus[2], len(corpus[1]) + 4)
    assert not torch.allclose(ours[0], torch.tensor(expected[0]["target_logprobs"]), atol=1e-2)


def test_the_cli_imports_then_translates(folders, tmp_path, capsys):
    folder, _ = folders[next(iter(CASES))]
    out = tmp_path / "m.safetensors"
    assert main(["import", "--from", "fairseq", str(folder / "checkpoint_best.pt"), "--spm", str(folder / "spm.model"),
                 "--tgt-lang", "en", "--out", str(out), "--trust-checkpoint"]) == 0
    assert "a Transformer of 2+2 layers" in capsys.readouterr().out
    assert load_checkpoint(out).languages == {"tgt": "en"}  # the task's src / tgt are not language codes


def test_a_pickle_is_read_only_when_trusted(folders, tmp_path, capsys):
    folder, _ = folders[next(iter(CASES))]
    assert main(["import", "--from", "fairseq", str(folder), "--out", str(tmp_path / "m.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint_best.pt is a pickle" in err and "--trust-checkpoint" in err
    assert not (tmp_path / "m.safetensors").exists()


def test_what_attnkit_cannot_express_is_refused_in_one_line(folders, tmp_path):
    folder, _ = folders[next(iter(CASES))]

    def make(change: str):
        def apply(bad: dict) -> None:
            if change == "layernorm_embedding":
                bad["model"]["encoder.layernorm_embedding.weight"] = torch.ones(16)
            elif change == "gelu_accurate":
                bad["cfg"]["model"]["activation_fn"] = "gelu_accurate"
            else:
                for side in ("encoder", "decoder"):
                    bad["model"][f"{side}.embed_positions.weight"] = torch.randn(66, 16)
        return apply

    for change, words in (("layernorm_embedding", "a LayerNorm on the embeddings"),
                          ("gelu_accurate", "the activation 'gelu_accurate'"),
                          ("learned", "the encoder's and the decoder's learned positions differ")):
        with pytest.raises(CheckpointError) as e:
            imported(rewritten(folder, tmp_path / change, make(change)), tmp_path / change)
        assert words in str(e.value) and "\n" not in str(e.value)


def test_malformed_dictionaries_are_named_by_file_and_line(tmp_path):
    path = tmp_path / "dict.src.txt"
    path.write_text("▁a 10\n▁b ten\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"dict.src.txt:2: not 'SYMBOL COUNT'"):
        fairseq_format.read_dictionary(path)
    path.write_text("▁a 10\n▁a 5\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"dict.src.txt:2: '▁a' is named twice"):
        fairseq_format.read_dictionary(path)
    path.write_text("▁a 10\n<unk> 3 #fairseq:overwrite\n▁b 1\n", encoding="utf-8")
    assert fairseq_format.read_dictionary(path).pieces == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "▁a": 4,
                                                           "▁b": 5}


def test_fairseqs_sinusoid_is_its_own():
    """Sines then cosines at frequencies 10000^(-i / (D/2 - 1)): row 2 (fairseq's first position) at channel 0 is
    sin(2), at channel D/2 - 1 sin(2e-4); attnkit's interleaved sinusoid differs."""
    from attnkit.nn import sinusoid_table

    table = fairseq_format.fairseq_sinusoid(4, 8)
    angles = torch.tensor([2.0, 2e-4])  # position 2 at frequencies 1 and 10000^(-3/3)
    torch.testing.assert_close(table[2, [0, 3, 4, 7]], torch.cat([angles.sin(), angles.cos()]))
    assert not torch.allclose(table, sinusoid_table(4, 8))
