"""BLEU tokenised for the target language: sacreBLEU's 13a reads a Chinese sentence as one or two "words", so two
Chinese sentences, one identical to its reference and one a character off, score 0.00; attnkit picks `zh` for a
Chinese target from the code prepare recorded (copied into the checkpoint by training) or, with none, from the
references' script, prints the choice with sacreBLEU's signatures and reports chrF beside BLEU, in every path that
scores: evaluate, the trainer's dev BLEU (and so best_metric: bleu), experiment compare and by-length."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacrebleu.tokenizers.tokenizer_zh import TokenizerZh

from attnkit.checkpoint import average_checkpoints, checkpoint_languages, load_checkpoint
from attnkit.cli.main import main
from attnkit.config import RunConfig, TrainConfig
from attnkit.data import prepare, read_lines, write_number_corpus
from attnkit.data.dataset import data_languages
from attnkit.errors import ConfigError
from attnkit.eval import bleu_tokenizer, score_corpus
from attnkit.eval.bleu import language_of, script_language, tokenizer_available
from conftest import tiny_model_config

REFS = ["我喜欢吃苹果。", "他昨天去了上海。"]
HYPS = ["我喜欢吃苹果。", "他昨天去了北京。"]  # the first identical, the second two characters off
MECAB = {"ja": "ja-mecab" if tokenizer_available("ja-mecab") else "char",
         "ko": "ko-mecab" if tokenizer_available("ko-mecab") else "13a"}


def test_13a_and_zh_differ_as_sacrebleu_documents():
    """sacreBLEU's 13a leaves a Chinese sentence without spaces in one piece (the full stop aside), its zh
    tokeniser splits every Chinese character off, and sacreBLEU itself picks zh for a Chinese target
    (BLEU(trg_lang='zh')): under 13a the two sentences have no 4-gram at all and score 0.00."""
    assert Tokenizer13a()(HYPS[1]).split() == ["他昨天去了北京。"]
    assert TokenizerZh()(HYPS[1]).split() == list(HYPS[1])
    by_13a = BLEU(tokenize="13a").corpus_score(HYPS, [REFS]).score
    documented = BLEU(trg_lang="zh")  # sacreBLEU's own choice for a Chinese target
    assert by_13a == 0.0
    zh = documented.corpus_score(HYPS, [REFS]).score
    assert zh > 50

    told = score_corpus(HYPS, REFS, tokenize="13a")
    untold = score_corpus(HYPS, REFS)  # no language anywhere: the references' script decides
    assert told.bleu == by_13a and "tok:13a" in told.signature
    assert untold.bleu == pytest.approx(zh) and untold.signature == str(documented.get_signature())
    assert untold.tokenizer.name == "zh" and "Chinese" in untold.tokenizer.reason
    assert untold.chrf == pytest.approx(CHRF().corpus_score(HYPS, [REFS]).score) and "nc:6" in untold.signature_chrf
    assert score_corpus(HYPS, REFS, lang="zh").bleu == pytest.approx(zh)


@pytest.mark.parametrize(("code", "expected"), [("zh", "zh"), ("zh-Hans", "zh"), ("zh_TW", "zh"), ("cmn", "zh"),
                                                ("yue", "zh"), ("ja", MECAB["ja"]), ("jpn", MECAB["ja"]),
                                                ("ko", MECAB["ko"]), ("en", "13a"), ("de", "13a")])
def test_the_target_languages_code_picks_the_tokenizer(code, expected):
    """A Chinese, Japanese or Korean code picks its tokeniser whatever the references hold; ja-mecab / ko-mecab
    only where MeCab is installed (else Japanese by character, Korean, written with spaces, by 13a)."""
    choice = bleu_tokenizer(["an English reference."], lang=code)
    assert choice.name == expected
    assert f"target language {code}" in choice.reason
    if expected in ("char", "13a") and language_of(code) in ("ja", "ko"):
        assert "pip install sacrebleu[" in choice.reason


@pytest.mark.parametrize(("refs", "expected"), [
    (["我很忙。", "汤姆在哪里？"], "zh"),
    (["我叫Tom，住在New York。"], "zh"),  # Latin names do not outvote the sentence around them
    (["私は学生です。", "東京に行きました。"], "ja"),
    (["저는 학생입니다.", "서울에 갔어요."], "ko"),
    (["Tom lives in Beijing (北京)."], None),
    (["Hello, world!", "1 2 3"], None),
    ([""], None),
])
def test_without_a_code_the_references_script_decides(refs, expected):
    lang, why = script_language(refs)
    assert lang == expected
    choice = bleu_tokenizer(refs)
    assert choice.name == ({"zh": "zh", None: "13a"}.get(expected) or MECAB[expected])
    assert "no target language recorded" in choice.reason and "% CJK characters" in why
    # a recorded non-CJK code (a suffix such as `tgt` too) leaves the decision to the script as well
    assert bleu_tokenizer(refs, lang="tgt").name == choice.name


def test_tokenize_overrides_and_refuses_in_one_line():
    assert bleu_tokenizer(REFS, lang="zh", tokenize="char").name == "char"
    assert bleu_tokenizer(REFS, lang="zh", tokenize="13a").reason == "chosen with --tokenize"
    with pytest.raises(ConfigError, match="unknown BLEU tokenizer 'spm'"):
        bleu_tokenizer(REFS, tokenize="spm")
    if not tokenizer_available("ja-mecab"):
        with pytest.raises(ConfigError, match=r"needs MeCab: pip install sacrebleu\[ja\]$"):
            score_corpus(HYPS, REFS, tokenize="ja-mecab")


def test_evaluate_on_plain_files_says_which_tokenizer_it_used(tmp_path, capsys):
    (tmp_path / "hyp.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    base = ["evaluate", "--hyp", str(tmp_path / "hyp.txt"), "--ref", str(tmp_path / "ref.txt")]
    assert main(base) == 0
    out = capsys.readouterr().out
    expected = BLEU(tokenize="zh").corpus_score(HYPS, [REFS]).score
    guessed = "zh (no target language recorded, 100% of the references in Han script: Chinese (a guess: Japanese " \
              "written only in kanji looks the same; name the target language to be sure))"
    assert out.splitlines()[0] == (f"BLEU {expected:.2f} (cased) / {expected:.2f} (lowercased), tok:{guessed}, "
                                   "chrF2 66.69, exact match 50.0%")
    assert "tok:zh" in out and "chrF signature: nrefs:1|case:mixed|eff:yes|nc:6" in out
    assert f"tokenizer:      {guessed}" in out
    assert main([*base, "--tokenize", "13a"]) == 0
    out = capsys.readouterr().out
    assert "BLEU 0.00 (cased)" in out and "tok:13a" in out and "chosen with --tokenize" in out
    assert main([*base, "--tgt-lang", "zh"]) == 0
    assert "(lowercased), tok:zh (target language zh), chrF2" in capsys.readouterr().out
    assert main([*base, "--tokenize", "nope"]) == 2
    assert "unknown BLEU tokenizer 'nope'" in capsys.readouterr().err


ENGLISH = ["I am busy.", "Where is Tom?", "It is raining today.", "He went to Shanghai.", "I like apples.",
           "See you tomorrow."]


def test_mixed_scripts_and_a_mecab_fallback_are_said(tmp_path, capsys):
    """One tokeniser scores the corpus, chosen by most references: with --tgt-lang en and 40% Chinese references
    13a is kept, but the score line says why and one warning line says that 40% are in Han script (13a reads each
    as one word), pointing at --tokenize zh; below MIXED_SHARE nothing is said. A Japanese or Korean target
    without MeCab falls back to char / 13a saying so in one line."""
    refs = ENGLISH + REFS * 2  # 6 English, 4 Chinese
    with pytest.warns(UserWarning) as said:
        choice = bleu_tokenizer(refs, lang="en")
    assert (choice.name, choice.reason) == ("13a", "target language en, 60% of the references in other scripts "
                                                   "than CJK")
    assert [str(w.message) for w in said] == list(choice.warnings) and len(choice.warnings) == 1
    assert "of the references 40% in Han script, which 13a misreads" in choice.warnings[0]
    assert "--tokenize zh" in choice.warnings[0]
    assert bleu_tokenizer(ENGLISH * 2 + REFS[:1], lang="en").warnings == ()  # 1 in 13: under 10%
    assert bleu_tokenizer(REFS + ENGLISH[:1], lang="zh").warnings == ()  # zh reads Latin text as 13a does

    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    for path in (hyp, ref):
        path.write_text("\n".join(refs) + "\n", encoding="utf-8")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", "en"]) == 0
    out, err = capsys.readouterr()
    assert "(lowercased), tok:13a (target language en, 60% of the references in other scripts than CJK), chrF2" in out
    assert err == f"attnkit: warning: {choice.warnings[0]}\n"

    japanese = ["私は学生です。", "東京に行きました。"]
    if not tokenizer_available("ja-mecab"):
        with pytest.warns(UserWarning, match=r"^BLEU tokenised char for Japanese, not ja-mecab: sacreBLEU's "
                                             r"ja-mecab needs MeCab \(pip install sacrebleu\[ja\]\)"):
            assert bleu_tokenizer(japanese, lang="ja").name == "char"
    if not tokenizer_available("ko-mecab"):
        with pytest.warns(UserWarning, match=r"^BLEU tokenised 13a for Korean, not ko-mecab"):
            assert bleu_tokenizer(["저는 학생입니다."], lang="ko").name == "13a"


def test_kanji_only_text_is_chinese_only_as_a_guess(recwarn):
    """Japanese written only in kanji cannot be told from Chinese by its script: with the language given it is
    Japanese (and its kanji-only references no mixed script); guessed, the reason says it is a guess. Each
    reference counts by its own script, so kana in a few Japanese lines are not outvoted by one long line."""
    kanji = ["東京大学", "日本国憲法", "大阪城公園"]
    guessed = bleu_tokenizer(kanji)
    assert guessed.name == "zh" and "100% of the references in Han script: Chinese (a guess" in guessed.reason
    told = bleu_tokenizer([*kanji, "私は学生です。"], lang="ja")
    assert told.name == MECAB["ja"] and told.reason.startswith("target language ja")
    assert not [w for w in told.warnings if "of the references" in w]  # kanji-only lines read alike under ja
    mixed = bleu_tokenizer(["私は学生です。", "東京に行きました。", "これは本です。", "日本国憲法前文" * 20])
    assert mixed.name == MECAB["ja"] and "75% of the references in kana (Japanese): Japanese" in mixed.reason
    assert "a guess" not in mixed.reason


# --- the languages recorded: prepare -> prepare.json -> checkpoint -> every scorer ------------------------------
@pytest.fixture(scope="module")
def en_zh(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """English number words -> Chinese numerals (the demo's corpus the other way round): written without spaces."""
    return write_number_corpus(tmp_path_factory.mktemp("en-zh"), lang="zh", n_train=400, n_valid=40, n_test=40)


def run_config(**train) -> RunConfig:
    base = dict(max_tokens=400, lr=1e-2, schedule="inverse_sqrt", warmup=10, eval_bleu=True, max_epochs=3,
                log_every=5, device="cpu", best_metric="bleu", keep_epochs=3)
    return RunConfig(model=tiny_model_config(dropout=0.0), train=TrainConfig(**{**base, **train}))


@pytest.fixture(scope="module")
def en_zh_run(tmp_path_factory, en_zh, one_thread):
    """`attnkit prepare --src en --tgt zh` and a tiny Transformer trained three epochs, best by dev BLEU."""
    from attnkit.train.trainer import Trainer

    root = tmp_path_factory.mktemp("en-zh-run")
    prefix = Path(en_zh["train"][0]).with_suffix("")
    assert main(["prepare", "--src", "en", "--tgt", "zh", "--train", str(prefix), "--valid",
                 str(prefix.parent / "valid"), "--test", str(prefix.parent / "test"), "--vocab-size", "80",
                 "--out", str(root / "data")]) == 0
    metrics = Trainer(run_config(), root / "data", root / "run", progress=False).fit()
    return root / "data", root / "run", metrics


def test_prepare_records_the_languages_and_training_copies_them_into_every_checkpoint(en_zh_run, tmp_path):
    data, run, _ = en_zh_run
    assert json.loads((data / "prepare.json").read_text())["settings"]["languages"] == {"src": "en", "tgt": "zh"}
    assert data_languages(data) == {"src": "en", "tgt": "zh"}
    for name in ("best", "last", "epoch0003"):
        path = run / "checkpoints" / f"{name}.safetensors"
        assert checkpoint_languages(path) == {"src": "en", "tgt": "zh"} == load_checkpoint(path).languages
    avg = average_checkpoints(sorted((run / "checkpoints").glob("epoch*.safetensors")), tmp_path / "avg.safetensors")
    assert avg.languages == checkpoint_languages(tmp_path / "avg.safetensors") == {"src": "en", "tgt": "zh"}


def test_a_chinese_runs_dev_bleu_is_scored_by_character_and_picks_the_best_epoch(en_zh_run):
    """Under 13a every epoch of this run scores 0.0 and best.safetensors stays the epoch-1 model; tokenised by
    character, the dev BLEU logged is the one a fresh process computes from the checkpoint, with chrF beside it,
    and the best checkpoint is the epoch of the highest dev BLEU."""
    from attnkit.decode import Translator

    data, run, metrics = en_zh_run
    with open(run / "metrics.csv", newline="") as f:
        valid = [row for row in csv.DictReader(f) if row["split"] == "valid"]
    bleus = [float(row["bleu"]) for row in valid]
    assert len(bleus) == 3 and max(bleus) > 0 and all(row["chrf"] for row in valid)
    log = (run / "train.log").read_text(encoding="utf-8")
    assert "dev BLEU: tokenizer zh (target language zh); sacreBLEU nrefs:1|case:mixed|eff:no|tok:zh" in log
    sources, refs = read_lines(data / "valid.src.txt"), read_lines(data / "valid.tgt.txt")
    hyps = Translator.from_checkpoint(run / "checkpoints" / "last.safetensors", device="cpu").translate_texts(sources)
    assert metrics["bleu"] == pytest.approx(BLEU(tokenize="zh").corpus_score(hyps, [refs]).score)
    assert metrics["chrf"] == pytest.approx(CHRF().corpus_score(hyps, [refs]).score)
    best = load_checkpoint(run / "checkpoints" / "best.safetensors").train_state
    assert best["best"] == pytest.approx(max(bleus), rel=1e-5) and best["epoch"] == 1 + bleus.index(max(bleus))


def test_a_folder_prepared_before_languages_were_recorded_is_scored_by_its_script(en_zh_run, tmp_path, one_thread):
    """No `languages` in prepare.json (older folders): nothing is recorded in the checkpoint, and the dev BLEU
    still tokenises the Chinese references by character."""
    import shutil

    from attnkit.train.trainer import Trainer

    data = tmp_path / "old"
    shutil.copytree(en_zh_run[0], data)
    meta = json.loads((data / "prepare.json").read_text())
    del meta["settings"]["languages"]
    (data / "prepare.json").write_text(json.dumps(meta))
    assert data_languages(data) == {"src": None, "tgt": None}
    trainer = Trainer(run_config(max_steps=2, max_epochs=1, eval_max_sentences=8), data, tmp_path / "run",
                      progress=False)
    trainer.fit()
    assert checkpoint_languages(tmp_path / "run" / "checkpoints" / "last.safetensors") == {}
    assert "tokenizer zh (no target language recorded" in (tmp_path / "run" / "train.log").read_text()


def test_the_experiments_score_chinese_by_character_with_chrf(en_zh_run, tmp_path, one_thread):
    from attnkit.decode import DecodeOptions, Translator
    from attnkit.experiments.by_length import bleu_by_length
    from attnkit.experiments.compare import evaluate_checkpoint

    data, run, _ = en_zh_run
    best = run / "checkpoints" / "best.safetensors"
    out = evaluate_checkpoint(best, data, DecodeOptions(), "cpu")
    hyps = Translator.from_checkpoint(best, device="cpu").translate_texts(read_lines(data / "test.src.txt"))
    refs = read_lines(data / "test.tgt.txt")
    assert out["bleu_tokenizer"] == "zh"
    assert out["test_bleu"] == pytest.approx(BLEU(tokenize="zh").corpus_score(hyps, [refs]).score)
    assert out["test_chrf"] == pytest.approx(CHRF().corpus_score(hyps, [refs]).score)
    said = []
    sources = read_lines(data / "test.src.txt")
    results = bleu_by_length({"m": best}, sources, refs, tmp_path / "by", n_buckets=2, say=said.append)
    assert said[0] == "BLEU tokenizer: zh (target language zh)"  # from the checkpoint
    lengths = [len(s.split()) for s in sources]
    for bucket in results["m"]:
        idx = [i for i, n in enumerate(lengths) if bucket["bucket"][0] <= n <= bucket["bucket"][1]]
        expected = BLEU(tokenize="zh").corpus_score([hyps[i] for i in idx], [[refs[i] for i in idx]]).score
        assert bucket["bleu"] == pytest.approx(expected)


def test_prepare_without_languages_records_none(tmp_path, en_zh):
    prepare(tmp_path / "d", en_zh["train"], vocab_size=60)
    assert data_languages(tmp_path / "d") == {"src": None, "tgt": None}
    assert data_languages(tmp_path / "nowhere") == {"src": None, "tgt": None}  # no prepare.json at all


def test_by_length_counts_chinese_and_japanese_by_character(en_zh_run, tmp_path, one_thread):
    """--unit words on Chinese sources: `split` makes every sentence one word (one bucket); each Han or kana
    character counts as a word, each Latin word or number between them too, punctuation not."""
    from attnkit.experiments.by_length import bleu_by_length

    data, run, _ = en_zh_run
    sources = read_lines(data / "test.tgt.txt")  # Chinese numerals as sources: the lengths are what is tested
    results = bleu_by_length({"m": run / "checkpoints" / "best.safetensors"}, sources, sources, tmp_path / "by",
                             n_buckets=3, say=lambda line: None)
    buckets = [b["bucket"] for b in results["m"]]
    lengths = [len(s) for s in sources]  # the numerals: Han characters only
    assert len(buckets) == 3 and buckets[0][0] == min(lengths) and buckets[-1][1] == max(lengths) > 1
    assert sum(b["sentences"] for b in results["m"]) == len(sources)
    from attnkit.experiments.by_length import source_words

    assert [source_words(s) for s in ("我很忙。", "我叫Tom，住在New York。", "私は学生です。", "3 个苹果",
                                      "Hello, world!", "저는 학생입니다.")] == [3, 7, 6, 4, 2, 2]
