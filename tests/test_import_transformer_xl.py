"""Transformer-XL import (attnkit.formats.transformer_xl), with Hugging Face's TransfoXLLMHeadModel as the oracle.

The oracle lives in transformers 4.x (transformers 5 dropped the model), which .ci/run installs into
build/oracles/transformers4 beside this project's own environment; tests/oracles/transfo_xl.py builds tiny random
models there (every parameter drawn), saves them as Hugging Face does, and reads several segments with the memory
carried. Imported, attnkit gives the same log-probabilities (to 1e-4) and the same memories, for the layouts the
released models use: adaptive input and softmax with div_val > 1 and a projected, untied cluster 0 (wt103), div_val 1,
one softmax, u/v per layer and shared, same_length and clamp_len, d_embed != d_model. The check fails when one
mapping is changed (the sinusoid's layout, the order of the head's clusters, u/v taken from one layer for all, the
vocabulary's offset).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit.checkpoint import load_lm_checkpoint, save_checkpoint
from attnkit.cli.main import main
from attnkit.errors import AttnkitError
from attnkit.formats import import_transformer_xl
from attnkit.formats import transformer_xl as xl_format
from attnkit.io import trust_pickle
from conftest import serve_extra

ORACLE = Path(__file__).resolve().parents[1] / "build" / "oracles" / "transformers4" / "bin" / "python"
SCRIPT = Path(__file__).resolve().parent / "oracles" / "transfo_xl.py"
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not ORACLE.exists(), reason="the oracle, transformers 4.x in "
                                 "build/oracles/transformers4, is not installed (.ci/run installs it)")]

B, SEGMENTS, T, MEM = 2, 3, 5, 6
SYMBOLS = ["<eos>", "<unk>", *(f"w{i}" for i in range(38))]  # V = 40, ids in this order
BASE = dict(vocab_size=len(SYMBOLS), d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=24, n_layer=3,
            mem_len=MEM, clamp_len=0, same_length=False, dropout=0.0, dropatt=0.0, adaptive=True,
            proj_share_all_but_first=True, pre_lnorm=False, tgt_len=T, eos_token_id=0)
CASES = {  # the layouts of the released models and the reference's defaults
    "wt103-like: div_val 2, untied cluster-0 projection, u/v per layer":
        dict(cutoffs=[8, 20], div_val=2, untie_r=True),
    "div_val 1, shared u/v, clamp_len -1 (none)": dict(cutoffs=[8, 20], div_val=1, untie_r=False, clamp_len=-1),
    "one softmax, same_length, clamp_len": dict(cutoffs=[], div_val=1, untie_r=True, same_length=True, clamp_len=4),
    "d_embed 12, projected at div_val 1": dict(cutoffs=[8, 20], div_val=1, d_embed=12, untie_r=False),
}


def oracle(folder: Path, case: dict, *, safetensors: bool | None = None, vocab: bool = True
           ) -> dict[str, torch.Tensor]:
    """Build, save and run the Hugging Face model of `case` in `folder`; its outputs. The weights go to
    model.safetensors where Hugging Face writes one (it refuses for u/v shared by the layers: pytorch_model.bin)."""
    safetensors = case["untie_r"] if safetensors is None else safetensors
    ids = torch.randint(0, len(SYMBOLS), (B, SEGMENTS * T), generator=torch.Generator().manual_seed(1))
    spec = {"config": {**BASE, **case}, "seed": 0, "ids": ids.tolist(), "segment": T, "safetensors": safetensors,
            "vocab": SYMBOLS if vocab else None}
    folder.mkdir(parents=True)
    (folder / "case.json").write_text(json.dumps(spec))
    done = subprocess.run([str(ORACLE), str(SCRIPT), str(folder / "case.json"), str(folder)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"ids": ids, **load_file(folder / "outputs.safetensors")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("transfo-xl")
    return {name: (root / f"case{i}", oracle(root / f"case{i}", case)) for i, (name, case) in enumerate(CASES.items())}


def imported(folder: Path, tmp_path: Path, **kw):
    token = trust_pickle.set(True)  # vocab.pkl is a pickle
    try:
        ckpt = import_transformer_xl(folder, **kw)
    finally:
        trust_pickle.reset(token)
    save_checkpoint(tmp_path / "xl.safetensors", ckpt)
    return load_lm_checkpoint(tmp_path / "xl.safetensors")


def errors(model, cfg, out: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The largest differences from the oracle's log-probabilities and memories over the segments."""
    lp_err = mem_err = 0.0
    mems = None
    with torch.no_grad():
        for s in range(SEGMENTS):
            logits, mems = model(out["ids"][:, s * T:(s + 1) * T], mems, mem_len=MEM, clamp_len=cfg.train.clamp_len)
            lp_err = max(lp_err, (logits.log_softmax(-1) - out[f"logprobs.{s}"]).abs().max().item())
            for i, m in enumerate(mems):
                mem_err = max(mem_err, (m - out[f"mems.{s}.{i}"].transpose(0, 1)).abs().max().item())
    return lp_err, mem_err


@pytest.mark.parametrize("name", list(CASES))
def test_imported_model_computes_what_hugging_face_computes(folders, tmp_path, name):
    folder, out = folders[name]
    model, vocab, cfg = imported(folder, tmp_path)
    c = cfg.model
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size) == (3, 16, 2, 24, len(SYMBOLS))
    assert (c.cutoffs, c.div_val, c.share_uv) == (CASES[name]["cutoffs"], CASES[name]["div_val"],
                                                 not CASES[name]["untie_r"])
    assert c.same_length == CASES[name].get("same_length", False) and cfg.train.clamp_len == max(0, CASES[name].get(
        "clamp_len", 0))
    assert c.tie_output == (CASES[name]["div_val"] == 1 and "d_embed" not in CASES[name])
    assert vocab.tokens == SYMBOLS and vocab.unk == 1
    lp_err, mem_err = errors(model, cfg, out)
    assert lp_err < 1e-4 and mem_err < 1e-4, (lp_err, mem_err)


CORRUPTIONS = {  # each mapping changed once: the check above must see it
    "sinusoid layout": lambda mp: mp.setattr(xl_format, "halves_order", lambda d: torch.arange(d)),
    "cluster order": lambda mp: mp.setattr(xl_format, "cluster_rows", lambda n, reverse: torch.arange(n).flip(0)),
    "u/v of layer 0 in every layer": lambda mp: mp.setattr(xl_format, "_layer", _first_layers_uv(xl_format._layer)),
}


def _first_layers_uv(layer):
    def corrupted(t, s, i):
        out, first = layer(t, s, i), layer(t, s, 0)
        out.update({k.replace("layers.0.", f"layers.{i}."): v for k, v in first.items() if "_bias" in k
                    and "r_" in k})
        return out
    return corrupted


@pytest.mark.parametrize("change", list(CORRUPTIONS))
def test_the_check_fails_when_a_mapping_changes(folders, tmp_path, monkeypatch, change):
    folder, out = folders["wt103-like: div_val 2, untied cluster-0 projection, u/v per layer"]
    CORRUPTIONS[change](monkeypatch)
    model, _, cfg = imported(folder, tmp_path)
    assert errors(model, cfg, out)[0] > 1e-2


def test_the_vocabulary_is_the_tokenizers_and_an_offset_shows(folders, tmp_path, monkeypatch):
    """vocab.pkl as TransfoXLTokenizer saves it (its whole state, sacremoses objects and all) gives its idx2sym; a
    vocabulary shifted by one encodes every word to another id."""
    folder, _ = folders["div_val 1, shared u/v, clamp_len -1 (none)"]
    _, vocab, _ = imported(folder, tmp_path)
    line = "w3 w17 nosuchword w0"
    assert vocab.encode([line]).tolist() == [SYMBOLS.index(w) if w in SYMBOLS else 1 for w in line.split()] + [0]
    read = xl_format._symbols_of_pickle
    monkeypatch.setattr(xl_format, "_symbols_of_pickle", lambda p: (lambda s: s[1:] + s[:1])(read(p)))
    _, shifted, _ = imported(folder, tmp_path)
    assert shifted.encode([line]).tolist() != vocab.encode([line]).tolist()


def test_torch_save_files_and_a_text_vocabulary(tmp_path):
    """pytorch_model.bin (tied tensors saved twice) reads as model.safetensors does; vocab.txt needs no trust, the
    pickles are refused without it in one line."""
    wt103 = CASES["wt103-like: div_val 2, untied cluster-0 projection, u/v per layer"]
    out = oracle(tmp_path / "bin", wt103, safetensors=False)
    with pytest.raises(AttnkitError, match="pytorch_model.bin is a pickle.*--trust-checkpoint"):
        import_transformer_xl(tmp_path / "bin")
    model, _, cfg = imported(tmp_path / "bin", tmp_path)
    assert max(errors(model, cfg, out)) < 1e-4
    st = tmp_path / "st"
    oracle(st, wt103)
    (st / "vocab.pkl").unlink()
    with pytest.raises(AttnkitError, match=r"no vocabulary \(vocab.pkl, vocab.bin, vocab.txt\); name one with --vocab"):
        import_transformer_xl(st)
    (st / "vocab.txt").write_text("".join(f"{s} 1\n" for s in SYMBOLS), encoding="utf-8")
    assert import_transformer_xl(st).tokenizers  # no trust needed: safetensors and text


def test_a_reference_state_dict_without_config(folders, tmp_path):
    """The PyTorch reference's and NVIDIA's names (no `transformer.`), in a training checkpoint's dict, with no
    config.json: the architecture comes from the shapes. Their head reads tail cluster i from column -i (Hugging
    Face's, from the TensorFlow reference, from column V_0 + i - 1), so the same network saved by the reference holds
    the cluster rows in reverse: written so, it imports as the model Hugging Face computes."""
    folder, out = folders["wt103-like: div_val 2, untied cluster-0 projection, u/v per layer"]
    state = {k.removeprefix("transformer."): v for k, v in load_file(folder / "model.safetensors").items()}
    for name in ("crit.cluster_weight", "crit.cluster_bias"):
        state[name] = state[name].flip(0)
    torch.save({"model_state": state, "epoch": 3}, tmp_path / "checkpoint_best.pt")
    (tmp_path / "vocab.txt").write_text("\n".join(SYMBOLS) + "\n", encoding="utf-8")
    token = trust_pickle.set(True)
    try:
        ckpt = import_transformer_xl(tmp_path / "checkpoint_best.pt")
    finally:
        trust_pickle.reset(token)
    save_checkpoint(tmp_path / "x.safetensors", ckpt)
    model, _, cfg = load_lm_checkpoint(tmp_path / "x.safetensors")
    assert max(errors(model, cfg, out)) < 1e-4


def _malformed(folder: Path, tmp: Path, how) -> Path:
    copy = tmp / "bad"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    how(copy)
    return copy


def _edit_config(**changes):
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **changes}))
    return edit


def _drop_tensor(name: str):
    def drop(folder: Path) -> None:
        tensors = load_file(folder / "model.safetensors")
        save_file({k: v for k, v in tensors.items() if k != name}, folder / "model.safetensors")
    return drop


MALFORMED = {
    "truncated weights": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:500]),
                          "model.safetensors: not a readable safetensors file"),
    "a missing tensor": (_drop_tensor("transformer.layers.1.pos_ff.CoreNet.3.weight"),
                         "model.safetensors: no tensor 'layers.1.pos_ff.CoreNet.3.weight'"),
    "pre-LN": (_edit_config(pre_lnorm=True), "config.json: field 'pre_lnorm' is true"),
    "another model": (_edit_config(model_type="marian"), "config.json: field 'model_type' is 'marian'"),
    "a field of the wrong type": (_edit_config(same_length="yes"), "config.json: field 'same_length' is 'yes'"),
    "a clamp_len that is not a number": (_edit_config(clamp_len="all"), "config.json: field 'clamp_len' is 'all'"),
    "sizes that disagree": (_edit_config(n_layer=5), "config.json: field 'n_layer' is 5, the weights' layers 3"),
    "a short vocabulary": (lambda f: (f / "vocab.pkl").unlink() or (f / "vocab.txt").write_text("a\nb\n"),
                           "vocab.txt: 2 symbols for a model of 40 words"),
    "an empty vocabulary line": (lambda f: (f / "vocab.pkl").unlink() or (f / "vocab.txt").write_text("a\n\nb\n"),
                                 "vocab.txt: line 2 is empty"),
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_a_malformed_model_is_one_line_naming_file_and_field(folders, tmp_path, capsys, what):
    folder, _ = folders["wt103-like: div_val 2, untied cluster-0 projection, u/v per layer"]
    how, message = MALFORMED[what]
    bad = _malformed(folder, tmp_path, how)
    code = main(["import", "--from", "transformer-xl", str(bad), "--out", str(tmp_path / "x.safetensors"),
                 "--trust-checkpoint"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "x.safetensors").exists()


def test_every_lm_verb_runs_on_an_imported_model(folders, tmp_path, capsys):
    """import, then prepare text with the model's vocabulary, lm eval (with the cache too), lm generate, lm speed
    on the imported architecture."""
    folder, out = folders["wt103-like: div_val 2, untied cluster-0 projection, u/v per layer"]
    ckpt = tmp_path / "xl.safetensors"
    assert main(["import", "--from", "transformer-xl", str(folder), "--out", str(ckpt), "--trust-checkpoint"]) == 0
    assert "a Transformer-XL of 3 layers" in capsys.readouterr().out
    text = tmp_path / "text.txt"
    text.write_text("\n".join(" ".join(SYMBOLS[i] for i in row if i) for row in out["ids"].tolist()) * 4 + "\n")
    data = tmp_path / "data"
    assert main(["lm", "prepare", "--vocab-from", str(ckpt), "--valid", str(text), "--test", str(text),
                 "--out", str(data)]) == 0
    assert main(["lm", "eval", "--checkpoint", str(ckpt), "--data", str(data), "--split", "test",
                 "--cache", "8", "--cache-theta", "0.5", "--cache-lambda", "0.1"]) == 0
    report = capsys.readouterr().out
    assert "ppl" in report and "cache" in report, report
    assert main(["lm", "generate", "--checkpoint", str(ckpt), "--prompt", "w3 w4", "--length", "6",
                 "--seed", "0"]) == 0
    words = capsys.readouterr().out.split()
    assert words[:2] == ["w3", "w4"] and all(w in SYMBOLS for w in words), words
    assert main(["lm", "speed", "--checkpoint", str(ckpt), "--lengths", "16", "32", "--runs", "1"]) == 0
    table = capsys.readouterr().out
    assert "d_model 16, 3 layers" in table and len([r for r in table.splitlines() if r.startswith("| 32 ")]) == 1, table


def test_the_service_and_its_explorer_run_an_imported_model(folders, tmp_path, capsys):
    """POST /generate streams what `attnkit lm generate` prints (spaces between words), POST /explore shows the
    imported model's self-attention over [memory | segment]."""
    httpx = serve_extra()
    from attnkit.serve.lm_app import create_lm_app
    from serving import events, running

    folder, _ = folders["wt103-like: div_val 2, untied cluster-0 projection, u/v per layer"]
    ckpt = tmp_path / "xl.safetensors"
    assert main(["import", "--from", "transformer-xl", str(folder), "--out", str(ckpt), "--trust-checkpoint"]) == 0
    capsys.readouterr()
    assert main(["lm", "generate", "--checkpoint", str(ckpt), "--prompt", "w3 w4", "--length", "8", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    with running(create_lm_app(*load_lm_checkpoint(ckpt), max_output_tokens=16)) as url:
        with httpx.stream("POST", url + "/generate", json={"prompt": "w3 w4", "length": 8, "seed": 3},
                          timeout=60) as r:
            streamed = "".join(d["text"] for name, d in events(r) if name == "token")
        explored = httpx.post(url + "/explore", json={"text": " ".join(SYMBOLS[2:30])}, timeout=60)
    assert "w3 w4" + streamed + "\n" == printed, printed
    assert explored.status_code == 200
    self_view = explored.json()["items"][0]["hypotheses"][0]["kinds"]["self"]
    assert len(self_view["layers"]) == 3 and self_view["keys"][-3:] == SYMBOLS[27:30], self_view["keys"]
