"""`attnkit bench`'s opus-mt-shape workloads (mt-opus-greedy, mt-opus-beam5): the catalogue and the CLI, the shape
and the data rule, the random MarianMTModel directory (transformers and CTranslate2's converter read it, the build is
seeded), the toolkits decoding it to the same ids, the output check against transformers, and a quick run end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnkit.bench import catalog, measure, opus, workloads
from attnkit.bench import runner as bench
from attnkit.cli import bench as bench_cli
from attnkit.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = workloads.QUICK.mt_opus  # vocabulary 203, d 32, 2+2 layers, 4 greedy / 2 beam sources, 6 new tokens
HAS_IMPORTER = not opus.unavailable("attnkit")
HAS_CT2 = catalog.installed("ctranslate2") and not opus.unavailable("ct2-float32")
needs_hf = pytest.mark.skipif(bool(opus.unavailable("hf")), reason=opus.unavailable("hf") or "")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder of this module's own (subprocesses inherit it through the environment)."""
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("bench-cache")
        mp.setenv("ATTNKIT_BENCH_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def hf_dir(cache) -> Path:
    if opus.unavailable("hf"):
        pytest.skip(opus.unavailable("hf"))
    opus.build(SHAPE, ["hf"])
    return opus.part_path(SHAPE, "hf")


def decode(toolkit: str, beam: int) -> torch.Tensor:
    """The toolkit's Marian adapter on the quick shape's sources: (B, T) Marian ids."""
    adapter = measure.toolkit(toolkit).marian
    model = adapter.build(SHAPE).eval()
    n = SHAPE.greedy_batch if beam == 1 else SHAPE.beam_batch
    return adapter.generate(model, workloads.opus_sources(n, SHAPE), beam, SHAPE.tgt_len)


# --- catalogue, CLI, shape and data ---------------------------------------------------------------
def test_opus_workloads_are_in_the_catalogue_and_the_cli_help(capsys):
    assert catalog.OPUS_WORKLOADS == ("mt-opus-greedy", "mt-opus-beam5")
    assert catalog.GROUPS["opus"] == list(catalog.OPUS_WORKLOADS)
    assert set(catalog.OPUS_WORKLOADS) <= set(catalog.GROUPS["mt"]) & set(catalog.GROUPS["all"])
    assert bench.expand_workloads(["opus"]) == ["mt-opus-greedy", "mt-opus-beam5"]
    assert {"opus", *catalog.OPUS_WORKLOADS} <= set(bench_cli.WORKLOAD_CHOICES)
    planned = {tk for tk, spec in catalog.TOOLKITS.items() if "mt-opus-greedy" in spec.workloads}
    assert planned == {"attnkit", "attnkit-int8", "huggingface", "ctranslate2", "ctranslate2-int8"}
    assert main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    assert "mt-opus-greedy" in text and "mt-opus-beam5" in text and "opus-mt" in text


def test_standard_opus_shape_is_opus_mt_base():
    s = workloads.STANDARD.mt_opus
    assert (s.vocab, s.d_model, s.heads, s.ffn, s.layers) == (65001, 512, 8, 2048, 6)
    assert (s.src_len, s.tgt_len, s.greedy_batch, s.beam_batch, s.beam, s.decode_runs) == (24, 24, 64, 16, 5, 3)
    assert workloads.mt_shape("mt-opus-beam5", workloads.STANDARD) is s
    assert workloads.mt_shape("mt-opus-greedy", workloads.QUICK) is SHAPE


def test_opus_sources_follow_the_generator_rule():
    src = workloads.opus_sources(64, workloads.STANDARD.mt_opus)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(src[:, :-1], torch.randint(2, 2 + 32499, (64, 23), generator=g))
    assert src.shape == (64, 24) and src[:, -1].eq(0).all()  # Marian's </s> is 0


# --- the directory ----------------------------------------------------------------------------------
@needs_hf
def test_the_directory_is_an_opus_mt_like_marian_model(hf_dir):
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(hf_dir)
    cfg, pad = model.config, SHAPE.vocab - 1
    assert (cfg.vocab_size, cfg.d_model, cfg.encoder_layers, cfg.decoder_layers) == (203, 32, 2, 2)
    assert (cfg.activation_function, cfg.scale_embedding, cfg.share_encoder_decoder_embeddings) == ("swish", True, True)
    assert (cfg.pad_token_id, cfg.decoder_start_token_id, cfg.eos_token_id) == (pad, pad, 0)
    assert model.generation_config.bad_words_ids == [[pad]]
    assert model.final_logits_bias.abs().min() > 0  # an output bias on every token
    assert not model.get_input_embeddings().weight[pad].any()  # the decoder's start: a zero vector

    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    vocab = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
    assert tokenizer.get_vocab() == vocab and len(vocab) == SHAPE.vocab
    assert opus.marian_vocab(hf_dir) == sorted(vocab, key=vocab.get)
    assert (vocab["</s>"], vocab["<unk>"], vocab["<pad>"]) == (0, 1, pad)
    # Source pieces (CJK characters) from the source model, target pieces (letters) from the target model.
    assert tokenizer("丁丂七").input_ids[-4:] == [vocab["丁"], vocab["丂"], vocab["七"], 0]
    assert tokenizer(text_target="b a").input_ids == [vocab["▁b"], vocab["▁a"], 0]


@needs_hf
def test_the_build_is_seeded(hf_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BENCH_CACHE", str(tmp_path))
    opus.build(SHAPE, ["hf"])
    again = opus.part_path(SHAPE, "hf")
    assert again != hf_dir
    for name in ("model.safetensors", "source.spm", "target.spm", "vocab.json"):
        assert (again / name).read_bytes() == (hf_dir / name).read_bytes(), name


def test_missing_parts_are_built_in_a_process_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(opus.sys, "executable", "/bin/false")  # the builder's process fails at once
    with pytest.raises(RuntimeError, match="building the opus-mt-shape model in .* failed"):
        opus.ensure(SHAPE, ["hf"])
    (tmp_path / opus.model_root(SHAPE).name / "hf").mkdir(parents=True)  # present: no process at all
    assert opus.ensure(SHAPE, ["hf"]) == {"hf": opus.model_root(SHAPE) / "hf"}


@pytest.mark.skipif(not HAS_IMPORTER, reason="attnkit.formats.marian is not in this attnkit yet")
def test_the_import_is_redone_when_any_module_of_the_importer_changes(monkeypatch):
    """The importer is several modules (attnkit/formats/*.py): a cached import made by any other version of one of
    them is not reused."""
    before = opus.part_path(SHAPE, "attnkit")
    read = Path.read_bytes
    edited = b"\n# edited\n"
    monkeypatch.setattr(Path, "read_bytes", lambda self: read(self) + edited * (self.name == "marian_vocab.py"))
    after = opus.part_path(SHAPE, "attnkit")
    assert after != before and after.parent == before.parent and after.name.startswith("attnkit-")


# --- the toolkits read the same model ---------------------------------------------------------------
@needs_hf
@pytest.mark.skipif(not HAS_CT2, reason="ctranslate2 is not installed")
@pytest.mark.parametrize("beam", [1, 5])
def test_ctranslate2_conversion_decodes_as_transformers(hf_dir, beam):
    opus.build(SHAPE, ["ct2-float32"])
    hf, ct2 = decode("huggingface", beam), decode("ctranslate2", beam)
    assert ct2.shape == hf.shape == ((SHAPE.greedy_batch if beam == 1 else SHAPE.beam_batch), SHAPE.tgt_len)
    assert torch.equal(ct2, hf)


@needs_hf
@pytest.mark.skipif(not HAS_IMPORTER, reason="attnkit.formats.marian is not in this attnkit yet")
@pytest.mark.parametrize("beam", [1, 5])
def test_attnkit_import_decodes_as_transformers(hf_dir, beam):
    opus.build(SHAPE, ["attnkit"])
    assert torch.equal(decode("attnkit", beam), decode("huggingface", beam))


# --- the output check ---------------------------------------------------------------------------------
def opus_rows(attnkit_ids: list[list[int]], hf_ids: list[list[int]]) -> list[dict]:
    common = {"workload": "mt-opus-greedy", "peak_rss_mb": 500.0, "params": 7, "notes": "a model", "version": "1"}
    return [{**common, "toolkit": "attnkit", "tok_s": 300.0, "output_ids": attnkit_ids},
            {**common, "toolkit": "attnkit-int8", "tok_s": 480.0, "output_ids": hf_ids},
            {**common, "toolkit": "huggingface", "tok_s": 100.0, "output_ids": hf_ids},
            {**common, "toolkit": "ctranslate2-int8", "tok_s": 400.0, "output_ids": hf_ids}]


def test_the_greedy_check_passes_when_attnkit_equals_transformers():
    rows = bench.annotate(opus_rows([[5, 6, 7], [8, 9, 10]], [[5, 6, 7], [8, 9, 10]]))
    assert bench.greedy_check(rows) == {"sentences_equal": 2, "sentences": 2, "identical": True}
    text = bench.render(rows, dtype="float32", threads=2, quick=True)
    assert "greedy check: attnkit float32's output equals HF transformers' token for token in all 2 sentences" in text
    assert "output = HF's in 2/2 sentences" in text
    assert "attnkit int8 ÷ CTranslate2 int8 1.20× (goal ≥ 1.2×)" in text
    assert "attnkit ÷ HF transformers 3.00× (goal ≥ 1.5×)" in text
    assert all("output_ids" not in r and len(r["output_sha256"]) == 64 for r in rows)


def test_the_greedy_check_fails_when_the_outputs_differ():
    rows = bench.annotate(opus_rows([[5, 6, 7], [8, 9, 11]], [[5, 6, 7], [8, 4, 10]]))
    check = bench.greedy_check(rows)
    assert not check["identical"] and check["sentences_equal"] == 1
    assert check["first_difference"] == {"sentence": 1, "token": 1, "ids": [9], "reference": [4]}
    text = bench.render(rows, dtype="float32", threads=2, quick=True)
    assert ("greedy check FAILED: attnkit float32's output equals HF transformers' in 1 of 2 sentences; first "
            "difference: sentence 1, token 1 (attnkit [9], HF [4])") in text
    assert "output = HF's in 1/2 sentences" in text


@pytest.mark.parametrize("same", [True, False], ids=["passes", "fails"])
def test_the_command_exits_with_1_after_the_whole_table_when_the_check_fails(monkeypatch, tmp_path, capsys, same):
    hf_ids = [[5, 6, 7], [8, 9, 10]]
    attnkit_ids = hf_ids if same else [[5, 6, 7], [8, 9, 11]]
    monkeypatch.setattr(bench, "run_bench", lambda *args, **kw: opus_rows(attnkit_ids, hf_ids))
    out = tmp_path / "bench.jsonl"
    code = main(["bench", "--quick", "--workloads", "opus", "--json", out])
    text, err = capsys.readouterr()
    assert "### MT at the opus-mt shape" in text and text.rstrip().endswith(bench.FOOTNOTES[-1])  # all of it
    assert len(out.read_text().splitlines()) == 4  # and the results, for a look at what failed
    if same:
        assert (code, err) == (0, "")
        return
    assert "greedy check FAILED" in text
    assert code == 1 and err == ("attnkit: the greedy check FAILED: attnkit float32's output equals HF transformers' "
                                 "in 1 of 2 sentences of mt-opus-greedy (the first difference is under the opus-mt "
                                 "table)\n")


def test_the_greedy_check_says_when_it_was_not_made():
    rows = opus_rows([[5]], [[5]])
    rows[2] = {"toolkit": "huggingface", "workload": "mt-opus-greedy", "skipped": "skipped: not installed"}
    text = bench.render(bench.annotate(rows), dtype="float32", threads=2, quick=True)
    assert bench.greedy_check(rows) is None and "greedy check: not made" in text


# --- end to end ---------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_hf
def test_quick_opus_bench_end_to_end(cache, tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    assert main(["bench", "--quick", "--threads", "1", "--workloads", "opus", "--json", out]) == 0
    text, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    planned = [(tk, w) for w in catalog.OPUS_WORKLOADS for tk in catalog.TOOLKITS
               if w in catalog.TOOLKITS[tk].workloads]
    assert [(r["toolkit"], r["workload"]) for r in rows] == planned
    assert "bench: the opus-mt-shape model (" in err and "### MT at the opus-mt shape" in text
    measured = {(r["toolkit"], r["workload"]): r for r in rows if "tok_s" in r}
    assert {("huggingface", w) for w in catalog.OPUS_WORKLOADS} <= set(measured)
    if HAS_CT2:
        assert {("ctranslate2", w) for w in catalog.OPUS_WORKLOADS} <= set(measured)
        assert measured["ctranslate2", "mt-opus-greedy"]["same_as_hf"]["identical"]
    if HAS_IMPORTER:
        assert measured["attnkit", "mt-opus-greedy"]["same_as_hf"]["identical"]
        assert measured["attnkit", "mt-opus-beam5"]["same_as_hf"]["identical"]
        assert "greedy check: attnkit float32's output equals HF transformers' token for token in all 4" in text
    else:
        assert all("attnkit.formats.marian" in r["skipped"] for r in rows if r["toolkit"] == "attnkit")
    for r in measured.values():
        assert r["tok_s"] > 0 and r["quick"] and r["threads"] == 1 and len(r["output_sha256"]) == 64
        label = f"| {bench.workload_label(r['workload'], workloads.QUICK)} | {bench.TOOLKIT_LABELS[r['toolkit']]} |"
        assert label in text
