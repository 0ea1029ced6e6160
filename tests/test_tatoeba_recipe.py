"""The Tatoeba Chinese-English recipes, code only (the hour-long runs are docs/results.md's): the two presets, the
evaluation script benchmarks/tatoeba.py on a tiny run laid out as Tatoeba is (choices on dev only, test never read
by a dev probe, BLEU tokenised for the target, chrF and signatures), its scoring of another system's outputs and its
tokenizer ceilings."""

from __future__ import annotations

import gzip
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF

from attnkit import config as cfgmod
from attnkit.cli.main import build_parser
from attnkit.config import RunConfig, TrainConfig
from attnkit.data import prepare, read_lines, write_number_corpus
from attnkit.presets import preset_path
from conftest import tiny_model_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "tatoeba.py"


@pytest.mark.parametrize("direction", ["zh-en", "en-zh"])
def test_the_presets_are_the_multi30k_recipe_and_name_their_prepare_command(direction):
    """Both presets train the Multi30k preset's model with its schedule (spelt out, so a change there does not move
    them); the prepare command their header gives parses and keeps the text as written (identity)."""
    cfg, m30k = cfgmod.resolve([f"tatoeba-{direction}"], []), cfgmod.resolve(["multi30k"], [])
    assert cfgmod.to_dict(cfg.model) == cfgmod.to_dict(m30k.model)
    differs = {k for k, v in cfgmod.to_dict(cfg.train).items() if v != cfgmod.to_dict(m30k.train)[k]}
    assert differs == {"max_epochs"} and cfg.train.max_minutes == 60 and cfg.train.best_metric == "bleu"
    header = [line.lstrip("#").strip() for line in preset_path(f"tatoeba-{direction}").read_text().splitlines()
              if line.startswith("#")]
    start = next(i for i, line in enumerate(header) if line.startswith("attnkit prepare"))
    command = shlex.split(f"{header[start]} {header[start + 1]}")
    args = build_parser()[0].parse_args(command[1:])
    assert (args.src, args.tgt) == tuple(direction.split("-"))
    assert (args.normalization, args.character_coverage, args.separate_vocab) == ("identity", 1.0, False)
    assert args.out == f"runs/tatoeba-{direction}/data"


def gz_lines(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def tatoeba_like(tmp_path_factory, one_thread):
    """Chinese numerals and English number words as Tatoeba lays out its files (SET.zh.gz, SET.en.gz), a folder
    prepared en->zh from them and a tiny Transformer trained two epochs on it, both kept."""
    from attnkit.train.trainer import Trainer

    root = tmp_path_factory.mktemp("tatoeba")
    corpus = write_number_corpus(root / "text", lang="zh", n_train=300, n_valid=24, n_test=24)
    raw = root / "raw"
    raw.mkdir()
    for split, name in (("train", "train"), ("valid", "dev"), ("test", "test")):
        for path, lang in zip(corpus[split], ("zh", "en")):
            gz_lines(raw / f"{name}.{lang}.gz", read_lines(path))
    pair = {name: (raw / f"{name}.en.gz", raw / f"{name}.zh.gz") for name in ("train", "dev", "test")}
    prepare(root / "data", pair["train"], pair["dev"], pair["test"], vocab_size=80, src_lang="en", tgt_lang="zh",
            normalization="identity")
    cfg = RunConfig(model=tiny_model_config(dropout=0.0),
                    train=TrainConfig(max_tokens=400, lr=1e-2, schedule="inverse_sqrt", warmup=10, max_epochs=2,
                                      device="cpu", best_metric="bleu", keep_epochs=2))
    Trainer(cfg, root / "data", root / "run", progress=False).fit()
    return raw, root / "data", root / "run"


def run_script(*args: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--threads", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_dev_probe_chooses_on_dev_and_scores_chinese_by_character(tatoeba_like, tmp_path):
    """--sets dev: the test files are never opened (here they are gone), the candidates and alpha are chosen on
    dev, and the figures are sacreBLEU's zh tokenisation of the outputs it wrote, with chrF and signatures."""
    raw, _, run = tatoeba_like
    dev_only = tmp_path / "raw"
    dev_only.mkdir()
    for name in ("dev.zh.gz", "dev.en.gz"):
        (dev_only / name).write_bytes((raw / name).read_bytes())
    out = run_script("--run", str(run), "--direction", "en-zh", "--data", str(dev_only), "--sets", "dev",
                     "--average", "2")
    assert "BLEU tokenizer: zh (target language zh)" in out
    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    assert list(results["sets"]) == ["dev"] and results["checkpoint"] in ("best", "avg2", "ens2")
    assert set(results["dev_alpha_bleu"]) == {"0.6", "0.8", "1.0", "1.2", "1.4"}
    refs = read_lines(dev_only / "dev.zh.gz")
    greedy = results["sets"]["dev"]["greedy"]
    hyps = read_lines(run / "hyp" / "dev.greedy.txt")
    assert greedy["bleu"] == pytest.approx(BLEU(tokenize="zh").corpus_score(hyps, [refs]).score)
    assert greedy["chrf"] == pytest.approx(CHRF().corpus_score(hyps, [refs]).score)
    assert "tok:zh" in greedy["signature"] and "nc:6" in greedy["signature_chrf"]
    assert greedy["bleu"] == pytest.approx(results["dev_greedy_bleu"][results["checkpoint"]])
    assert "tok:zh" in (run / "results.md").read_text(encoding="utf-8")


def test_another_systems_outputs_are_scored_the_same_way(tatoeba_like, tmp_path):
    raw, _, _ = tatoeba_like
    refs = {name: read_lines(raw / f"{name}.zh.gz") for name in ("dev", "test")}
    hyp = tmp_path / "hyp"
    hyp.mkdir()
    for name, lines in refs.items():  # a system that gets every second sentence right and drops the others' ends
        (hyp / f"{name}.beam5.txt").write_text("\n".join(r if i % 2 else r[:-1] for i, r in enumerate(lines)) + "\n",
                                               encoding="utf-8")
    out = run_script("--score", str(hyp), "--direction", "en-zh", "--data", str(raw))
    results = json.loads((hyp / "results.json").read_text(encoding="utf-8"))
    for name, lines in refs.items():
        expected = BLEU(tokenize="zh").corpus_score(read_lines(hyp / f"{name}.beam5.txt"), [lines]).score
        assert results["sets"][name]["beam5"]["bleu"] == pytest.approx(expected)
        assert "greedy" not in results["sets"][name]
    assert "| test | beam5 |" in out and "tokenizer zh (target language zh)" in out


def test_the_ceiling_is_the_target_tokenizers_round_trip(tmp_path):
    """What a folder's target tokenizer gives back of the dev references: all of them under identity, and under
    the default NFKC the sentences with fullwidth punctuation changed (and the BLEU a perfect system would get)."""
    zh = ["你好，世界！", "你好吗？", "我很忙。", "汤姆在哪里？"]
    en = ["Hello, world!", "How are you?", "I am busy.", "Where is Tom?"]
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, times in (("train", 20), ("dev", 1)):
        gz_lines(raw / f"{name}.zh.gz", zh * times)
        gz_lines(raw / f"{name}.en.gz", en * times)
    for rule in ("identity", "nmt_nfkc"):
        prepare(tmp_path / rule, (raw / "train.en.gz", raw / "train.zh.gz"), vocab_size=60, src_lang="en",
                tgt_lang="zh", normalization=rule)
    out = run_script("--ceiling", str(tmp_path / "identity"), str(tmp_path / "nmt_nfkc"), "--data", str(raw))
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in out.splitlines()[2:]]
    assert [cells[2] for cells in rows] == ["identity", "nmt_nfkc"]
    assert rows[0][5:8] == ["100.00", "100.00", "0"]
    assert rows[1][7] == "3"  # the three sentences with ， ！ or ？
    nfkc = ["你好,世界!", "你好吗?", "我很忙。", "汤姆在哪里?"]
    assert float(rows[1][5]) == pytest.approx(BLEU(tokenize="zh").corpus_score(nfkc, [zh]).score, abs=0.01)
