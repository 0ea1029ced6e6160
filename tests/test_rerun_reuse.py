"""A rerun of an experiment never mixes runs of other settings: `experiment lm-ablation` and `experiment compare`
reuse a trained model only where it was trained with the same resolved config (budget and overrides included) and
data, refuse otherwise in one line naming the difference, train from an empty folder with --force, and score a
checkpoint again when it is not the one a cached evaluation scored."""

from __future__ import annotations

import gzip
import json

import pytest

from attnkit.checkpoint import load_checkpoint, save_checkpoint
from attnkit.cli.main import main
from attnkit.data import prepare
from attnkit.data.lm import prepare_lm
from attnkit.experiments.compare import compare_models

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "".join(f"{who}: the {what} is {how}.\n" for who in ("ANNA", "BEN") for what in ("cat", "sea", "king")
               for how in ("here", "gone", "old")) * 4
TINY = ["--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--model.n_layers=1", "--train.batch_size=2",
        "--train.eval_batch_size=2", "--train.device=cpu", "--train.eval_interval=2", "--train.max_steps=2",
        "--train.warmup=1", "--train.eval_max_tokens=32", "--train.dtype=float32"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    (root / "tiny_shakespeare").mkdir()
    with gzip.open(root / "tiny_shakespeare" / "input.txt.gz", "wt", encoding="utf-8") as f:
        f.write(TEXT)
    return root


def ablation(out, corpora, *extra, data="tiny-shakespeare", minutes="5") -> list[str]:
    return ["experiment", "lm-ablation", "--data", str(data), "--corpora", str(corpora), "--out", str(out),
            "--models", "lm-char-small-xl", "--minutes-per-model", minutes, "--lengths", "8", "16", "--segment", "8",
            "--eval-batch-size", "2", "--eval-tokens", "80", "--quiet", "--device", "cpu", *TINY, *extra]


def one_line_error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnkit: error: "), err
    return err


def losses(out) -> dict:
    return json.loads((out / "lm_ablation.json").read_text())["models"][0]


def test_lm_ablation_rerun_with_another_budget_or_override_refuses_or_trains_anew(tmp_path, corpora, capsys):
    out = tmp_path / "ablation"
    assert main(ablation(out, corpora)) == 0
    first = losses(out)
    run_dir = out / "lm-char-small-xl"
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    err = one_line_error(capsys, ablation(out, corpora, minutes="6"))
    assert f"{run_dir} holds a model trained with train.max_minutes=5.0 (this run asks for 6.0): pass --force" in err
    err = one_line_error(capsys, ablation(out, corpora, "--train.max_steps=3"))
    assert "train.max_steps=2 (this run asks for 3)" in err
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before  # nothing touched
    assert main(ablation(out, corpora, "--train.max_steps=3", "--force")) == 0
    second = losses(out)
    assert first["steps"] == 2 and second["steps"] == 3
    assert second["losses"] != first["losses"]  # scored anew, not read from the first model's cached losses
    assert len(list((run_dir / "eval").glob("*.npy"))) == 2  # the first model's evaluations are gone
    assert main(ablation(out, corpora, "--train.max_steps=3")) == 0  # the same settings: reused as it is
    assert "trained already" in capsys.readouterr().out and losses(out) == second


def test_cached_evaluations_belong_to_the_checkpoint_they_scored(tmp_path, corpora, capsys):
    out = tmp_path / "ablation"
    assert main(ablation(out, corpora)) == 0
    first = losses(out)
    best = out / "lm-char-small-xl" / "checkpoints" / "best.safetensors"
    ckpt = load_checkpoint(best)  # other weights in the same place (e.g. trained again by hand)
    ckpt.model_state = {k: v * 0.5 if v.is_floating_point() else v for k, v in ckpt.model_state.items()}
    save_checkpoint(best, ckpt)
    assert main(ablation(out, corpora)) == 0
    assert losses(out)["losses"] != first["losses"]
    assert len(list((out / "lm-char-small-xl" / "eval").glob("*.npy"))) == 4  # two lengths, for each checkpoint


def test_lm_ablation_rerun_on_other_data_refuses(tmp_path, corpora, capsys):
    out = tmp_path / "ablation"
    assert main(ablation(out, corpora)) == 0
    err = one_line_error(capsys, ablation(out, corpora, data="wikitext-2"))
    assert f"--data wikitext-2: {out / 'data'} was prepared from tiny-shakespeare by an earlier run" in err
    other = tmp_path / "other"  # a prepared folder of another text, in the same OUT
    (tmp_path / "other.txt").write_text(TEXT.replace("cat", "dog"), encoding="utf-8")
    prepare_lm(other, tmp_path / "other.txt", level="char", valid_fraction=0.2)
    err = one_line_error(capsys, ablation(out, corpora, data=other))
    assert "trained with other data (the prepared folder's files differ)" in err


@pytest.fixture(scope="module")
def no_dev_set(tmp_path_factory, corpus_files):
    out = tmp_path_factory.mktemp("nodev") / "data"
    prepare(out, corpus_files["train"], vocab_size=120)
    return out


OVERRIDES = ["model.hidden=16", "model.embed_dim=8", "train.max_steps=2", "train.max_tokens=400", "train.device=cpu",
             "train.eval_bleu=false"]


def compare(data, out, *extra, minutes="5") -> list[str]:
    return ["experiment", "compare", "--data", str(data), "--out", str(out), "--models", "rnn-seq2seq", "--minutes",
            minutes, "--max-len-b", "4", "--quiet", *(f"--{o}" for o in OVERRIDES), *extra]


def test_compare_reuses_only_a_run_of_the_same_settings_and_retrains_from_an_empty_folder(
        tmp_path, data_dir, no_dev_set, capsys):
    out = tmp_path / "compare"
    assert main(compare(data_dir, out)) == 0
    best = out / "rnn-seq2seq" / "checkpoints" / "best.safetensors"
    assert best.exists()
    err = one_line_error(capsys, compare(data_dir, out, "--reuse", minutes="6"))
    assert "train.max_minutes=5.0 (this run asks for 6.0): pass --force" in err
    err = one_line_error(capsys, compare(no_dev_set, out, "--reuse"))
    assert "trained with other data" in err
    assert main(compare(data_dir, out, "--reuse")) == 0  # the same settings and data: evaluated as it is
    # trained again on a corpus without a dev set: no best checkpoint of its own, so its last one is scored, never
    # the best one the earlier run (other data, other tokenizers) left behind
    results = compare_models(["rnn-seq2seq"], no_dev_set, out, minutes=5, force=True, overrides=OVERRIDES,
                             progress=False, say=lambda _: None)
    assert results[0].checkpoint.endswith("last.safetensors") and not best.exists()


def test_a_record_from_before_a_field_existed_is_read_with_its_default():
    """A field added to the configs later (model.relative_clip, say) is missing from older runs' identity.json; its
    default is what those runs did, so a rerun asking for the default reuses them and one asking for another value
    names it."""
    from attnkit import config as cfgmod
    from attnkit.experiments.runs import difference

    wanted = json.loads(json.dumps({"config": cfgmod.to_dict(cfgmod.resolve(["lm-char-small-xl"])), "data": "d"}))
    older = json.loads(json.dumps(wanted))
    del older["config"]["model"]["relative_clip"]
    assert difference(older, wanted) is None
    other = json.loads(json.dumps(wanted))
    other["config"]["model"]["relative_clip"] = 8
    assert difference(older, other) == "model.relative_clip=16 (this run asks for 8)"
    older["config"]["model"]["d_model"] = 64
    assert difference(older, wanted) == f"model.d_model=64 (this run asks for {wanted['config']['model']['d_model']})"
