"""Moses + subword-nmt BPE (attnkit.data.moses_bpe) and fairseq models that use it, with fairseq itself as the oracle.

fairseq's own text pipeline (tests/oracles/fairseq_text.py: its `moses` tokenizer and `subword_nmt` BPE built by its
registries, its Dictionary) splits and joins English and German sentences full of what Moses treats specially
(& < > | [ ] quotes, apostrophes, dashes, abbreviations, numbers); attnkit gives the same ids (through the rows a
fairseq import gives them) and the same text back, and differs where a setting is changed (no escaping, no dash
splits, no Moses). A fairseq Transformer whose dictionary is BPE pieces, imported with its `bpecodes` found beside it,
scores fairseq's ids and translates to the text fairseq's pipeline makes of its greedy output, the same through
int8, the CTranslate2 export and the service. Without the oracle: the stored form, one-line errors, the UNK and
dropout rules, and the Marian export's refusal.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint import load_checkpoint
from attnkit.config import EOS_ID, UNK_ID
from attnkit.data.moses_bpe import MAGIC, MosesBPETokenizer, check_codes
from attnkit.data.tokenizer_kinds import tokenizer_from_bytes
from attnkit.errors import ConfigError, DataError
from attnkit.formats.fairseq_text import SPECIALS, read_dictionary
from attnkit.formats.marian_vocab import Side
from test_import_fairseq import ORACLE, SIZES, imported

sacremoses = pytest.importorskip("sacremoses")
learn_bpe = pytest.importorskip("subword_nmt.learn_bpe")

TEXT_ORACLE = Path(__file__).resolve().parent / "oracles" / "fairseq_text.py"
MODEL_ORACLE = Path(__file__).resolve().parent / "oracles" / "fairseq_transformer.py"
needs_fairseq = pytest.mark.skipif(not ORACLE.exists(), reason="the oracle, fairseq 0.12 in build/oracles/fairseq, "
                                   "is not installed (make oracles installs it)")

ENGLISH = [
    "The cat's toy -- a well-known brand -- costs $3.50 & more.",
    '"Don\'t go," she said; he didn\'t listen.',
    "Dr. Smith arrived at 5 p.m. in the U.S. office.",
    "It's a state-of-the-art system (version 2.0), isn't it?",
    "Tom & Jerry aren't <friends> | [enemies].",
    "1,000,000 people watched the e-mail's author on 12/05/2019.",
    "She asked: 'Who's there?' -- nobody answered...",
    "A child in a red shirt jumps over a wooden fence.",
    "Two dogs play with a ball on the green grass.",
    "The well-known man's hat fell into the river!",
]
GERMAN = [
    "Das Spielzeug der Katze -- eine bekannte Marke -- kostet 3,50 $ & mehr.",
    '"Geh nicht", sagte sie; er hörte nicht zu.',
    "Dr. Schmidt kam um 17 Uhr im US-Büro an.",
    "Es ist ein hochmodernes System (Version 2.0), nicht wahr?",
    "Tom & Jerry sind keine <Freunde> | [Feinde].",
    "1.000.000 Menschen sahen den Autor der E-Mail am 12.05.2019.",
    "Sie fragte: 'Wer ist da?' -- niemand antwortete...",
    "Ein Kind in einem roten Hemd springt über einen Holzzaun.",
    "Zwei Hunde spielen mit einem Ball auf dem grünen Gras.",
    "Der Hut des bekannten Mannes fiel in den Fluss!",
]
HELD_OUT = ["An unseen x-ray of Mr. O'Neil's zebra & co.", "Ein ungesehenes Röntgenbild -- 4,5 % mehr!"]


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory) -> dict[str, Path]:
    """bpecodes learned on the Moses-tokenized sentences of both languages, and dict.txt of their pieces (by count,
    fairseq's order) without the three rarest, so some pieces are UNK."""
    root = tmp_path_factory.mktemp("bpe")
    tokenized = [sacremoses.MosesTokenizer(lang).tokenize(s, aggressive_dash_splits=True, return_str=True,
                                                          escape=True)
                 for lang, texts in (("en", ENGLISH), ("de", GERMAN)) for s in texts]
    codes = io.StringIO()
    learn_bpe.learn_bpe(io.StringIO("\n".join(tokenized) + "\n"), codes, 120, min_frequency=2)
    (root / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = MosesBPETokenizer(codes.getvalue(), list(SPECIALS), lang=None)
    counts = Counter(p for line in tokenized for p in bpe.segment(line))
    kept = [p for p, _ in counts.most_common()][:-3]
    (root / "dict.txt").write_text("".join(f"{p} {counts[p]}\n" for p in kept), encoding="utf-8")
    return {"codes": root / "bpecodes", "dict": root / "dict.txt"}


def attnkit_side(bpe_files) -> Side:
    """The rows a fairseq import gives the dictionary: attnkit id r is fairseq's side.ids[r]."""
    vocab = read_dictionary(bpe_files["dict"])
    return Side.of(vocab, len(vocab.pieces), {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}, 2, [])


def fairseq_text(case: dict, tmp_path: Path) -> dict:
    (tmp_path / "case.json").write_text(json.dumps(case, ensure_ascii=False), encoding="utf-8")
    done = subprocess.run([str(ORACLE), str(TEXT_ORACLE), str(tmp_path / "case.json"), str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))


def tokenizer(bpe_files, lang: str | None, **kw) -> MosesBPETokenizer:
    return MosesBPETokenizer(bpe_files["codes"].read_text(encoding="utf-8"), attnkit_side(bpe_files).names, lang,
                             **kw)


@needs_fairseq
def test_attnkit_splits_and_joins_text_as_fairseq(bpe_files, tmp_path):
    texts = ENGLISH + HELD_OUT
    side = attnkit_side(bpe_files)
    first = fairseq_text({"codes": str(bpe_files["codes"]), "dict": str(bpe_files["dict"]), "source_lang": "en",
                          "target_lang": "de", "encode": texts, "decode": []}, tmp_path)
    ours = tokenizer(bpe_files, "en").encode(texts)
    assert [[side.ids[i] for i in ids] for ids in ours] == first["encoded"]
    assert any(UNK_ID in ids for ids in ours)  # the dictionary's missing pieces are read as <unk> by both
    german = fairseq_text({"codes": str(bpe_files["codes"]), "dict": str(bpe_files["dict"]), "source_lang": "de",
                           "target_lang": "de", "encode": GERMAN, "decode": []}, tmp_path)["encoded"]
    known = [ids for ids in german + first["encoded"] if 3 not in ids]  # fairseq writes "<unk>"; attnkit drops it
    assert len(known) >= 8
    joined = fairseq_text({"codes": str(bpe_files["codes"]), "dict": str(bpe_files["dict"]), "source_lang": "en",
                           "target_lang": "de", "encode": [], "decode": known}, tmp_path)["decoded"]
    back = {f: a for a, f in enumerate(side.ids)}
    assert tokenizer(bpe_files, "de").decode([[back[i] for i in ids] for ids in known]) == joined
    assert "&" in "".join(joined) and "'" in "".join(joined)  # unescaped, as fairseq's detokenizer gives them


@needs_fairseq
@pytest.mark.parametrize("wrong", [{"escape": False}, {"dash_splits": False}, {"lang": None}])
def test_the_check_fails_when_a_moses_setting_is_changed(bpe_files, tmp_path, wrong):
    side = attnkit_side(bpe_files)
    theirs = fairseq_text({"codes": str(bpe_files["codes"]), "dict": str(bpe_files["dict"]), "source_lang": "en",
                           "target_lang": "en", "encode": ENGLISH, "decode": []}, tmp_path)["encoded"]
    ours = tokenizer(bpe_files, **{"lang": "en", **wrong}).encode(ENGLISH)
    assert [[side.ids[i] for i in ids] for ids in ours] != theirs


@pytest.fixture(scope="module")
def bpe_model(bpe_files, tmp_path_factory) -> dict:
    """A tiny fairseq Transformer (shared tables) whose dictionary is the BPE pieces, its outputs for six pairs
    encoded by fairseq's pipeline, and its import with `bpecodes` found beside it."""
    tmp_path = tmp_path_factory.mktemp("fairseq-bpe")
    folder = tmp_path / "model"
    folder.mkdir()
    fs_ids = fairseq_text({"codes": str(bpe_files["codes"]), "dict": str(bpe_files["dict"]), "source_lang": "en",
                           "target_lang": "de", "encode": ENGLISH[:6], "decode": []}, tmp_path)["encoded"]
    tgt_ids = fairseq_text({"codes": str(bpe_files["codes"]), "dict": str(bpe_files["dict"]), "source_lang": "de",
                            "target_lang": "de", "encode": GERMAN[:6], "decode": []}, tmp_path)["encoded"]
    symbols = list(read_dictionary(bpe_files["dict"]).pieces)[4:]
    case = {"args": ["--arch", "transformer", *SIZES, "--share-all-embeddings"], "seed": 3, "symbols": symbols,
            "max_len_b": 12, "pairs": [[s, t] for s, t in zip(fs_ids, tgt_ids)]}
    (folder / "case.json").write_text(json.dumps(case))
    done = subprocess.run([str(ORACLE), str(MODEL_ORACLE), str(folder / "case.json"), str(folder)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder / "bpecodes").write_bytes(bpe_files["codes"].read_bytes())  # found beside the checkpoint
    return {"folder": folder, "path": imported(folder, tmp_path, src_lang="en", tgt_lang="de"), "symbols": symbols,
            "tgt_ids": tgt_ids, "expected": json.loads((folder / "outputs.json").read_text())}


@needs_fairseq
def test_a_fairseq_model_with_bpe_codes_imports_scores_and_translates_as_fairseq(bpe_files, bpe_model, tmp_path,
                                                                                  capsys):
    from attnkit.cli.main import main
    from attnkit.decode import Translator

    folder, path, symbols, tgt_ids, expected = (bpe_model[k] for k in ("folder", "path", "symbols", "tgt_ids",
                                                                        "expected"))
    translator = Translator.from_checkpoint(path, device="cpu")
    table = [*SPECIALS, *symbols]  # fairseq's ids
    assert [translator.tgt_tok.pieces(ids) for ids in translator.tgt_tok.encode(GERMAN[:6])] == [
        [table[i] for i in ids] for ids in tgt_ids]  # attnkit's own text -> pieces, as fairseq's
    scores = translator.score(ENGLISH[:6], GERMAN[:6])
    torch.testing.assert_close(torch.tensor(scores), torch.tensor([sum(e["target_logprobs"]) for e in expected]),
                               atol=1e-3, rtol=1e-4)
    out = translator.translate(ENGLISH[:6], beam=1, max_len_a=0.0, max_len_b=12, min_len=1)
    greedy = [e["greedy"][:-1] for e in expected]  # fairseq's ends with </s>
    assert [o.tgt_pieces for o in out] == [[table[i] for i in g] for g in greedy]
    texts = fairseq_text({"codes": str(bpe_files["codes"]), "dict": str(bpe_files["dict"]), "source_lang": "en",
                          "target_lang": "de", "encode": [], "decode": greedy}, tmp_path)["decoded"]
    known = [i for i, g in enumerate(greedy) if 3 not in g]  # fairseq writes "<unk>"; attnkit drops it
    assert known and [out[i].text for i in known] == [texts[i] for i in known]
    int8 = Translator.from_checkpoint(path, device="cpu", quantize="int8").translate(ENGLISH[:6], beam=2)
    assert all(o.text == translator.tgt_tok.decode([o.tokens])[0] for o in int8)  # the int8 path decodes the same way
    pytest.importorskip("ctranslate2")
    from attnkit.formats import CT2Translator, export_checkpoint

    exported = export_checkpoint(path, tmp_path / "ct2")
    stored = load_checkpoint(path).tokenizers  # Moses by each side's language: two tokenizers
    assert [(exported / f"{n}.moses-bpe").read_bytes() for n in ("source", "target")] == [stored["src"], stored["tgt"]]
    theirs = CT2Translator.from_dir(exported, threads=1).translate(ENGLISH[:6], beam=1, max_len_a=0.0, max_len_b=12,
                                                                   min_len=1)
    assert [t.text for t in theirs] == [o.text for o in out]  # CTranslate2 reads the stored Moses + BPE tokenizer
    cli = tmp_path / "cli.safetensors"
    assert main(["import", "--from", "fairseq", str(folder / "checkpoint_best.pt"), "--bpe-codes",
                 str(bpe_files["codes"]), "--src-lang", "en", "--tgt-lang", "de", "--out", str(cli),
                 "--trust-checkpoint"]) == 0
    assert "a Transformer of 2+2 layers" in capsys.readouterr().out
    assert load_checkpoint(cli).tokenizers == load_checkpoint(path).tokenizers  # given = found beside it


def test_the_stored_form_reads_back_as_the_same_tokenizer(bpe_files):
    tok = tokenizer(bpe_files, "en", escape=False)
    blob = tok.to_bytes()
    assert blob.startswith(MAGIC)
    back = tokenizer_from_bytes(blob)
    assert isinstance(back, MosesBPETokenizer) and back.to_bytes() == blob
    assert back.encode(ENGLISH) == tok.encode(ENGLISH) and back.escape is False
    ids = back.encode(["Two dogs play."])[0]
    assert back.decode([ids + [EOS_ID, 7]]) == ["Two dogs play."]  # everything after EOS ignored
    with pytest.raises(DataError, match="damaged"):
        tokenizer_from_bytes(MAGIC + b"{not json")


def test_unk_is_dropped_but_still_ends_its_word(bpe_files):
    tok = tokenizer(bpe_files, None)
    pieces = tok.names
    first = next(i for i, p in enumerate(pieces) if p.endswith("@@") and i > UNK_ID)
    word = next(i for i, p in enumerate(pieces) if p.isalpha() and i > UNK_ID)
    assert tok.decode([[first, UNK_ID, word]]) == [f"{pieces[first][:-2]} {pieces[word]}"]


def test_codes_errors_name_the_line_and_bpe_dropout_is_refused(bpe_files, monkeypatch):
    with pytest.raises(DataError, match=r"codes.txt:3: not a merge 'LEFT RIGHT' \(fastBPE"):
        check_codes("#version: 0.2\na b\nc d 12\n", "codes.txt")
    with pytest.raises(DataError, match=r"codes.txt:1: not a merge"):
        check_codes("abc\n", "codes.txt")
    with pytest.raises(DataError, match="no BPE codes"):
        check_codes("#version: 0.2\n", "codes.txt")
    with pytest.raises(ConfigError, match="BPE-dropout"):
        tokenizer(bpe_files, "en").encode(["a"], dropout=0.1)
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # not installed
    with pytest.raises(ConfigError, match="pip install sacremoses subword-nmt"):
        tokenizer(bpe_files, "en").encode(["a"])


def test_the_marian_export_refuses_a_moses_bpe_tokenizer(bpe_files, trained, tmp_path):
    """MarianMTModel reads sentencepiece models: a Transformer holding Moses + BPE is refused in one line."""
    import dataclasses

    from attnkit.checkpoint import save_checkpoint
    from attnkit.formats import export_marian

    ckpt = load_checkpoint(trained[1] / "checkpoints" / "best.safetensors")
    names = tokenizer_from_bytes(ckpt.tokenizers["src"]).pieces(list(range(ckpt.config.model.src_vocab_size)))
    blob = MosesBPETokenizer(bpe_files["codes"].read_text(encoding="utf-8"), names, "en").to_bytes()
    save_checkpoint(tmp_path / "moses.safetensors", dataclasses.replace(ckpt, tokenizers={"src": blob}))
    with pytest.raises(ConfigError, match=r"holds a Moses \+ BPE tokenizer \(fairseq's pipeline\)") as e:
        export_marian(tmp_path / "moses.safetensors", tmp_path / "hf")
    assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()


@needs_fairseq
def test_the_bpe_model_serves(bpe_model):
    from attnkit.decode import DecodeOptions, Translator
    from conftest import serve_extra

    httpx = serve_extra()
    from browser import served

    want = Translator.from_checkpoint(bpe_model["path"], device="cpu").translate(ENGLISH, DecodeOptions(beam=2,
                                                                                                      max_len=256))
    with served(bpe_model["path"]) as url:
        r = httpx.post(url + "/translate", json={"texts": ENGLISH, "beam": 2}, timeout=60)
    assert r.status_code == 200 and [t["text"] for t in r.json()["translations"]] == [t.text for t in want]
