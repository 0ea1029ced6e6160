"""Every verb on an imported Marian model, through the command line: `attnkit import --from marian`, translate (greedy,
beam, n-best, int8, `--engine ctranslate2` after export), score, serve with /translate and /explore (and the explorer
page in a browser where there is one), plot attention --html, a multilingual model's --target-tag; `attnkit export
--format huggingface`; and the one-line errors of a malformed or truncated model folder, or a hub name offline.
`transformers` (MarianMTModel.generate, MarianTokenizer) is the oracle of what the outputs must be."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit.cli.main import main
from attnkit.cpu import int8_unavailable
from attnkit.decode import DecodeOptions, Translator
from conftest import serve_extra
from marian_models import PAIRS, SAMPLE, TAGS, TARGET_TEXT, load_marian, write_marian

# MarianTokenizer asks for sacremoses, which it uses only in a method nothing here calls
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")]
LIMIT = 24
TAG = "deu"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(the Marian folder, the checkpoint `attnkit import` wrote of it, a file of SAMPLE): a multilingual model whose
    outputs end within LIMIT tokens."""
    root = tmp_path_factory.mktemp("marian-cli")
    folder = write_marian(root / "opus-mt-tiny", tags=TAGS, seed=3, memorize=120)
    assert main(["import", "--from", "marian", folder, "--out", root / "tiny.safetensors", "--src-lang", "en"]) == 0
    (root / "sample.txt").write_text("\n".join(SAMPLE) + "\n", encoding="utf-8")
    (root / "pairs.txt").write_text("\n".join(s for s, _ in PAIRS) + "\n", encoding="utf-8")
    return folder, root / "tiny.safetensors", root / "sample.txt"


def run(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def error(capsys, *argv) -> str:
    """The one line on stderr of a command that must fail with exit code 2."""
    code = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1, err
    return err


def generate(folder: Path, sources: list[str], n: int = 1, **kw) -> list[list[str] | None]:
    """Per source, MarianMTModel.generate's n texts; None where one reached the length limit (generate scores the EOS
    it forces there as 0, attnkit by its log-probability: a beam may then rank them otherwise)."""
    hf, tok = load_marian(folder)
    with torch.no_grad():
        out = hf.generate(**tok(sources, return_tensors="pt", padding=True), max_new_tokens=LIMIT + 1,
                          do_sample=False, num_return_sequences=n, **kw)
    texts = tok.batch_decode(out, skip_special_tokens=True)
    ended = [0 in seq[1 : LIMIT + 1] for seq in out.tolist()]  # Marian's EOS is 0
    return [texts[i : i + n] if all(ended[i : i + n]) else None for i in range(0, len(texts), n)]


def test_import_says_what_it_wrote(imported, capsys, tmp_path):
    out = run(capsys, "import", "--from", "marian", imported[0], "--out", tmp_path / "m.safetensors")
    assert "d_model 16, swish" in out and "target tags (3): cmn_Hans, deu, fra" in out
    assert "already exists" in error(capsys, "import", "--from", "marian", imported[0], "--out",
                                     tmp_path / "m.safetensors")


@pytest.mark.parametrize("options,hf", [([], {}), (["--beam", "4", "--nbest", "2"],
                                                   dict(num_beams=4, n=2, early_stopping="never"))],
                         ids=["greedy", "beam-nbest"])
def test_translate_equals_generate(imported, capsys, options, hf):
    folder, ckpt, sample = imported
    sources = [s for s, _ in PAIRS]  # each starts with its tag
    out = run(capsys, "translate", "--checkpoint", ckpt, "--input", sample.with_name("pairs.txt"), "--max-len-a", "0",
              "--max-len-b", LIMIT, *options).splitlines()
    n = hf.get("n", 1)
    ours = [out[i : i + n] for i in range(0, len(out), n)]
    theirs = generate(folder, sources, **hf)
    compared = [(a, b) for a, b in zip(ours, theirs, strict=True) if b is not None]
    assert len(compared) >= len(sources) * 2 // 3 and all(a == b for a, b in compared)


def test_target_tag_is_a_tag_before_every_source(imported, capsys):
    folder, ckpt, sample = imported
    out = run(capsys, "translate", "--checkpoint", ckpt, "--input", sample, "--target-tag", TAG, "--max-len-a", "0",
              "--max-len-b", LIMIT)
    hf, tok = load_marian(folder)  # greedy: the same tokens up to the limit, whatever a forced EOS scores
    with torch.no_grad():
        texts = tok.batch_decode(hf.generate(**tok([f">>{TAG}<< {s}" for s in SAMPLE], return_tensors="pt",
                                                   padding=True), max_new_tokens=LIMIT + 1, do_sample=False),
                                 skip_special_tokens=True)
    assert out.splitlines() == texts


def test_int8_translates_as_float32_does(imported, capsys):
    """On the sentences the model translates well (its training sources): int8's outputs are float32's, their scores
    within 0.05 (about 1% here). Where int8 cannot run, the warning says so and float32 runs."""
    _, ckpt, sample = imported
    flags = ["translate", "--checkpoint", ckpt, "--input", sample.with_name("pairs.txt"), "--format", "tsv"]
    exact, quantized = (run(capsys, *flags, *extra).splitlines()[1:] for extra in ([], ["--quantize", "int8"]))
    rows = [(a.split("\t"), b.split("\t")) for a, b in zip(exact, quantized, strict=True)]
    assert all(a[4] == b[4] for a, b in rows)
    assert all(abs(float(a[2]) - float(b[2])) < 0.05 for a, b in rows)
    if not int8_unavailable():
        assert any(a[2] != b[2] for a, b in rows)  # it ran in int8: scores move a little


def test_ctranslate2_export_translates_as_attnkit(imported, capsys, tmp_path):
    pytest.importorskip("ctranslate2")
    _, ckpt, sample = imported
    run(capsys, "export", "--checkpoint", ckpt, "--out", tmp_path / "ct2")
    ours = run(capsys, "translate", "--checkpoint", ckpt, "--input", sample, "--beam", "3", "--format", "tsv")
    theirs = run(capsys, "translate", "--engine", "ctranslate2", "--checkpoint", tmp_path / "ct2", "--input", sample,
                 "--beam", "3", "--format", "tsv")
    for a, b in zip(ours.splitlines()[1:], theirs.splitlines()[1:], strict=True):
        a, b = a.split("\t"), b.split("\t")
        assert a[4] == b[4] and float(a[2]) == pytest.approx(float(b[2]), abs=1e-3)
    assert "--engine attnkit" in error(capsys, "translate", "--engine", "ctranslate2", "--checkpoint", tmp_path / "ct2",
                                       "--input", sample, "--target-tag", TAG)


def test_score_is_marian_log_probability(imported, capsys, tmp_path):
    folder, ckpt, sample = imported
    targets = TARGET_TEXT[: len(SAMPLE)]
    (tmp_path / "tgt.txt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    ours = [float(x) for x in run(capsys, "score", "--checkpoint", ckpt, "--src", sample, "--tgt", tmp_path / "tgt.txt",
                                  "--target-tag", TAG).split()]
    hf, tok = load_marian(folder)
    for s, t, mine in zip(SAMPLE, targets, ours):
        labels = tok(text_target=t)["input_ids"]
        with torch.no_grad():
            logits = hf(**tok(f">>{TAG}<< {s}", return_tensors="pt"),
                        decoder_input_ids=torch.tensor([[hf.config.decoder_start_token_id, *labels[:-1]]])).logits[0]
        assert mine == pytest.approx(logits.log_softmax(-1)[range(len(labels)), labels].sum().item(), abs=2e-3)


def test_an_unknown_target_tag_is_one_line(imported, capsys):
    _, ckpt, sample = imported
    err = error(capsys, "translate", "--checkpoint", ckpt, "--input", sample, "--target-tag", "spa")
    assert "target tag 'spa' is not in this model's vocabulary (it knows 3: cmn_Hans, deu, fra)" in err


def test_plot_attention_html_shows_the_tag_and_the_translation(imported, capsys, tmp_path):
    folder, ckpt, _ = imported
    source = f">>{TAG}<< {SAMPLE[0]}"
    run(capsys, "plot", "attention", "--checkpoint", ckpt, "--src", source, "--html", "--out", tmp_path / "a.html")
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', page, re.S).group(1))
    (hyp,) = data["items"][0]["hypotheses"]
    assert hyp["kinds"]["cross"]["keys"][0] == f">>{TAG}<<" and hyp["kinds"]["cross"]["keys"][-1] == "</s>"
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    assert hyp["text"] == translator.translate([source])[0].text


def test_serve_translates_and_explores_into_the_target_tag(imported):
    httpx = serve_extra()
    from browser import Explorer, chromium, missing, served

    _, ckpt, _ = imported
    expected = Translator.from_checkpoint(ckpt, device="cpu", target_tag=TAG)
    with served(ckpt, "--target-tag", TAG) as url:
        r = httpx.post(url + "/translate", json={"texts": SAMPLE, "beam": 2}, timeout=60)
        assert r.status_code == 200
        want = expected.translate(SAMPLE, DecodeOptions(beam=2, max_len=256))
        assert [t["text"] for t in r.json()["translations"]] == [t.text for t in want]
        r = httpx.post(url + "/explore", json={"text": SAMPLE[3], "beam": 3, "nbest": 2}, timeout=60)
        hyps = r.json()["items"][0]["hypotheses"]
        best = expected.translate([SAMPLE[3]], DecodeOptions(beam=3, nbest=2, max_len=256))[0]
        assert [h["text"] for h in hyps] == [best.text, best.nbest[0].text]
        assert hyps[0]["kinds"]["cross"]["keys"][0] == f">>{TAG}<<"
        if missing():
            return
        driver = chromium()
        try:
            page = Explorer(driver, url)
            page.ask(SAMPLE[3])
            page.select("kind", "cross")
            assert [t for t, _ in page.tokens("right")][0] == f">>{TAG}<<"
        finally:
            driver.quit()


def test_export_huggingface_through_the_cli(imported, capsys, tmp_path):
    _, ckpt, _ = imported
    out = run(capsys, "export", "--format", "huggingface", "--checkpoint", ckpt, "--out", tmp_path / "hf")
    assert "Hugging Face MarianMTModel" in out and (tmp_path / "hf" / "model.safetensors").is_file()
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "source.spm", "target.spm",
        "tokenizer_config.json", "vocab.json"]
    assert "float32" in error(capsys, "export", "--format", "huggingface", "--checkpoint", ckpt, "--out",
                              tmp_path / "q", "--quantization", "int8")
    assert "one network" in error(capsys, "export", "--format", "huggingface", "--checkpoint", ckpt, ckpt, "--out",
                                  tmp_path / "two")


# --- a malformed or truncated folder: one line naming the file and the field ------------------------------------------
def _drop(name):
    return lambda folder: (folder / name).unlink()


def _edit_json(name, change):
    def edit(folder):
        data = json.loads((folder / name).read_text(encoding="utf-8"))
        change(data)
        (folder / name).write_text(json.dumps(data), encoding="utf-8")
    return edit


def _truncate(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _pickled(folder, truncate=False):
    path = folder / "pytorch_model.bin"
    torch.save(load_file(folder / "model.safetensors"), path)
    (folder / "model.safetensors").unlink()
    if truncate:
        path.write_bytes(path.read_bytes()[:1000])


def _positions_halves_swapped(folder):
    tensors = load_file(folder / "model.safetensors")
    d = 16
    table = torch.zeros(64, d)
    pos = torch.arange(64.0)[:, None] / 10000 ** (torch.arange(0, d, 2) / d)
    table[:, : d // 2], table[:, d // 2 :] = torch.cos(pos), torch.sin(pos)  # cosines first: not Marian's
    tensors["model.encoder.embed_positions.weight"] = table
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


MALFORMED = {
    "no config.json": (_drop("config.json"), [], "config.json: no such file"),
    "a config without d_model": (_edit_json("config.json", lambda c: c.pop("d_model")), [],
                                 "config.json: no field 'd_model'"),
    "an unknown activation": (_edit_json("config.json", lambda c: c.update(activation_function="gelu_new")), [],
                              "config.json: field 'activation_function' is 'gelu_new'"),
    "a truncated model.safetensors": (_truncate, [], "model.safetensors: not a readable safetensors file (truncated"),
    "a missing tensor": (lambda f: save_file({k: v for k, v in load_file(f / "model.safetensors").items()
                                              if "layers.1.fc2" not in k}, f / "model.safetensors"), [],
                         "no tensor 'model.encoder.layers.1.fc2.weight' (truncated"),
    "pytorch_model.bin, untrusted": (_pickled, [], "pytorch_model.bin is a pickle (torch.save) file"),
    "pytorch_model.bin, trusted, truncated": (lambda f: _pickled(f, truncate=True), ["--trust-checkpoint"],
                                              "pytorch_model.bin: not a readable torch.save file (truncated"),
    "a vocab.json without <pad>": (_edit_json("vocab.json", lambda v: v.pop("<pad>")), [],
                                   "vocab.json: no '<pad>' (pad_token_id)"),
    "an spm that is not one": (lambda f: (f / "source.spm").write_bytes(b"not a model" * 10), [],
                               "source.spm: not a sentencepiece model"),
    "positions that are not Marian's sinusoid": (_positions_halves_swapped, [],
                                                 "'model.encoder.embed_positions.weight' is not Marian's sinusoid"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_folder_is_one_line_naming_file_and_field(imported, capsys, tmp_path, case):
    spoil, flags, words = MALFORMED[case]
    folder = Path(shutil.copytree(imported[0], tmp_path / "broken"))
    spoil(folder)
    err = error(capsys, "import", "--from", "marian", folder, "--out", tmp_path / "m.safetensors", *flags)
    assert words in err and not (tmp_path / "m.safetensors").exists()


def test_pytorch_model_bin_imports_when_trusted(imported, tmp_path):
    folder = Path(shutil.copytree(imported[0], tmp_path / "bin"))
    _pickled(folder)
    assert main(["import", "--from", "marian", folder, "--out", tmp_path / "m.safetensors", "--trust-checkpoint"]) == 0
    assert load_file(tmp_path / "m.safetensors").keys() == load_file(imported[1]).keys()


def test_a_hub_name_is_read_from_the_cache_only(imported, tmp_path):
    """A hub name: from huggingface_hub's cache, offline; one not there is one line that says to download it."""
    pytest.importorskip("huggingface_hub")
    snapshot = tmp_path / "hub" / "models--tiny--opus-mt-x" / "snapshots" / ("0" * 40)
    shutil.copytree(imported[0], snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "attnkit", "import", "--from", "marian"]
    done = subprocess.run([*command, "tiny/opus-mt-x", "--out", tmp_path / "m.safetensors"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    missing = subprocess.run([*command, "Helsinki-NLP/opus-mt-zh-en", "--out", tmp_path / "n.safetensors"], env=env,
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "Hugging Face cache" in missing.stderr and "hf download Helsinki-NLP/opus-mt-zh-en" in missing.stderr
