"""Documents: a text cut into sentences joins back into itself, each language's sentence rule holds, and a
document's translation is its sentences' translations put back between its own spaces and line breaks, through the
Python API, `attnkit translate --document` and LibreTranslate's route."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.cli.main import main
from attnkit.data.sentences import sentence_pieces, sentences
from attnkit.decode import Translator, translate_document
from attnkit.decode.document import fitting_parts


@given(st.lists(st.sampled_from([*"ab .!?\n。”“\t\r", "Dr.", "3.5"]), max_size=30).map("".join),
       st.sampled_from(["de", "en", "zh", None]))
@settings(max_examples=200, deadline=None)
def test_the_pieces_join_back_into_the_text(text, lang):
    pieces = sentence_pieces(text, lang)
    assert "".join(part for part, _ in pieces) == text
    for part, move in pieces:
        assert (part == part.strip() and part != "") if move else part.strip() == ""


@pytest.mark.parametrize("line, lang, expected", [
    ("Ein Mann fährt Rad. Zwei Hunde spielen!  Dr. Müller kommt um 3.5 Uhr.", "de",
     ["Ein Mann fährt Rad.", "Zwei Hunde spielen!", "Dr. Müller kommt um 3.5 Uhr."]),
    ("He left at 5 p.m. Then it rained. Really?", "en", ["He left at 5 p.m.", "Then it rained.", "Really?"]),
    ("我们明天见。“他说：好。”然后走了……你好吗？", "zh", ["我们明天见。", "“他说：好。”", "然后走了……", "你好吗？"]),
    ("no end at all", "xx", ["no end at all"]),  # a language pysbd lacks: its English rules
])
def test_each_languages_sentence_rule(line, lang, expected):
    assert [s.strip() for s in sentences(line, lang)] == expected
    assert "".join(sentences(line, lang)) == line


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> Translator:
    return Translator.from_checkpoint(trained_checkpoint, "cpu")


DOCUMENT = "zweitausendvierundzwanzig. achthundertzweiundfünfzig!\n\n  fünfhundertelf \nelf"


def test_a_document_is_its_sentences_translated_in_place(translator):
    got = translate_document(translator, DOCUMENT, lang="de")
    t = [x.text for x in translator.translate(["zweitausendvierundzwanzig.", "achthundertzweiundfünfzig!",
                                               "fünfhundertelf", "elf"])]
    assert got == f"{t[0]} {t[1]}\n\n  {t[2]} \n{t[3]}"
    assert translate_document(translator, " \n\n", lang="de") == " \n\n"


def test_translate_document_through_the_cli(tmp_path, trained_checkpoint, translator, capsys):
    (tmp_path / "doc.de").write_text(DOCUMENT + "\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", trained_checkpoint, "--input", tmp_path / "doc.de", "--output",
                 tmp_path / "doc.en", "--document"]) == 0
    assert (tmp_path / "doc.en").read_text(encoding="utf-8") == translate_document(translator, DOCUMENT) + "\n"
    assert main(["translate", "--checkpoint", trained_checkpoint, "--input", tmp_path / "doc.de", "--document",
                 "--nbest", "2", "--beam", "2"]) == 2
    assert "--document writes the translated document alone; --nbest needs a sentence a line" in capsys.readouterr().err


def test_a_sentence_longer_than_the_model_reads_is_cut_at_clauses_not_truncated(trained_checkpoint, recwarn):
    short = Translator.from_checkpoint(trained_checkpoint, "cpu")
    sentence = "zweitausendvierundzwanzig, achthundertzweiundfünfzig; fünfhundertelf elf"
    short.max_src_len = max(len(short.lang_tags.encode([p])[0]) for p in sentence.replace(";", ",").split(", ")) + 1
    parts = fitting_parts(short, sentence)
    assert parts == ["zweitausendvierundzwanzig,", "achthundertzweiundfünfzig;", "fünfhundertelf elf"]
    assert all(len(short.lang_tags.encode([p])[0]) <= short.max_src_len for p in parts)
    got = translate_document(short, f"{sentence}\nelf", lang="de")
    alone = [t.text for t in short.translate([*parts, "elf"])]
    assert got == f"{alone[0]} {alone[1]} {alone[2]}\n{alone[3]}"
    assert translate_document(short, sentence, lang="de", tgt_lang="zh") == "".join(alone[:3])
    assert not [w for w in recwarn if "truncated" in str(w.message)]
