"""The attention explorer's data and bertviz export, checked against the arrays the models return: every family,
a beam's n-best, and bertviz itself reading the export."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnkit.cli.main import main
from attnkit.data.tokenizer import BOS_ID, EOS_ID
from attnkit.decode import DecodeOptions, Translator
from attnkit.viz.attention import load_views, translation_views
from attnkit.viz.explorer import bertviz_inputs, explorer_data, save_bertviz

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCES = ["einundzwanzig", "dreihundertvierundfünfzig"]
TEXT = "ANNA: the cat is here."


def test_every_hypothesis_of_a_beam_has_the_attention_of_its_own_tokens(family_checkpoints):
    translator = Translator.from_checkpoint(family_checkpoints["transformer"], device="cpu")
    options = DecodeOptions(beam=4, nbest=3)
    items = translation_views(translator, SOURCES, options)
    results = translator.translate(SOURCES, options)
    for hyps, result in zip(items, results):
        expected = [result, *result.nbest]
        assert [v.output for v in hyps] == [t.text for t in expected] and len(hyps) == 3
        assert [v.score for v in hyps] == [t.score for t in expected]
        for view, t in zip(hyps, expected):  # the model's own maps for this hypothesis, teacher-forced
            src = torch.as_tensor([[*translator.encode_sources([view.source])[0].tolist(), EOS_ID]])
            tgt_in = torch.as_tensor([[BOS_ID, *t.tokens]])  # BOS + the hypothesis
            with torch.no_grad():
                _, maps = translator.model.attention(src, tgt_in)
            for kind in ("encoder", "decoder", "cross"):
                for got, ref in zip(view.maps[kind], maps[kind]):
                    np.testing.assert_allclose(got, ref[0].numpy(), atol=1e-6)
            # the search's own cross-attention (last layer) is the teacher-forced one: cached == uncached
            searched = translator.translate([view.source], options, need_attention=True)[0]
            best = [searched, *searched.nbest][hyps.index(view)]
            np.testing.assert_allclose(best.attention.numpy().transpose(1, 0, 2), view.maps["cross"][-1], atol=1e-4)


def test_greedy_item_is_the_greedy_translation(family_checkpoints):
    translator = Translator.from_checkpoint(family_checkpoints["transformer"], device="cpu")
    (greedy,), = translation_views(translator, SOURCES[:1], DecodeOptions())
    assert greedy.output == translator.translate(SOURCES[:1])[0].text
    assert greedy.output == load_views(family_checkpoints["transformer"], SOURCES[:1])[0].output


@pytest.mark.parametrize("kind", ["transformer", "rnn-bahdanau", "rnn-hard", "transformer-xl", "vanilla-lm"])
def test_explorer_data_holds_every_map_of_every_family(family_checkpoints, kind):
    source = TEXT if kind in ("transformer-xl", "vanilla-lm") else SOURCES[1]
    (view,) = load_views(family_checkpoints[kind], [source])
    data = explorer_data([[view]], title="t", model=kind, task="x")
    kinds = data["items"][0]["hypotheses"][0]["kinds"]
    expected = {"transformer": ["encoder", "decoder", "cross"], "rnn-bahdanau": ["cross"],
                "rnn-hard": ["cross", "scores"], "transformer-xl": ["self"], "vanilla-lm": ["self"]}[kind]
    assert list(kinds) == expected
    for name in expected:
        np.testing.assert_allclose(np.asarray(kinds[name]["layers"]), np.stack(view.maps[name]), atol=1e-4)
        assert kinds[name]["queries"] == view.queries[name] and kinds[name]["keys"] == view.keys[name]
    if kind == "transformer-xl":
        assert kinds["self"]["boundary"] == len(view.keys["self"]) - len(view.queries["self"]) > 0
    json.dumps(data)  # what the page embeds and the server sends


def _bertviz():
    return pytest.importorskip("bertviz", reason="bertviz is not installed (pip install bertviz)")


@pytest.mark.parametrize("kind", ["transformer", "rnn-hard", "transformer-xl"])
def test_bertviz_reads_the_export(family_checkpoints, tmp_path, kind):
    bertviz = _bertviz()
    source = TEXT if kind == "transformer-xl" else SOURCES[1]
    (view,) = load_views(family_checkpoints[kind], [source])
    (path,) = save_bertviz([view], tmp_path / "attention.pt")
    inputs = torch.load(path, weights_only=True)  # plain tensors, tuples and strings
    html = bertviz.head_view(**inputs, html_action="return").data  # bertviz checks shapes against the tokens
    assert "Layer" in html
    bertviz.model_view(**inputs, html_action="return")
    if kind == "transformer-xl":
        m, keys = view.boundary["self"], view.keys["self"]
        assert inputs["tokens"] == keys
        for layer, ref in zip(inputs["attention"], view.maps["self"]):
            assert layer.shape == (1, ref.shape[0], len(keys), len(keys))
            assert torch.all(layer[0, :, :m] == 0)  # the memory's rows: not queries of this segment
            np.testing.assert_allclose(layer[0, :, m:].numpy(), ref)
    elif kind == "transformer":
        assert inputs["encoder_tokens"] == view.keys["encoder"] and inputs["decoder_tokens"] == view.keys["decoder"]
        for name, key in (("encoder_attention", "encoder"), ("decoder_attention", "decoder"),
                          ("cross_attention", "cross")):
            for layer, ref in zip(inputs[name], view.maps[key]):
                np.testing.assert_allclose(layer[0].numpy(), ref)
    else:  # an RNN: its alignment as one layer of one head; decoder tokens are BOS + the output
        assert inputs["encoder_tokens"] == view.keys["cross"]
        assert inputs["decoder_tokens"][1:] == view.queries["cross"][:-1]
        np.testing.assert_allclose(inputs["cross_attention"][0][0, 0].numpy(), view.maps["cross"][0][0])


def test_cli_writes_the_explorer_with_nbest_and_the_bertviz_files(family_checkpoints, tmp_path, capsys):
    ckpt = family_checkpoints["transformer"]
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    assert main(["plot", "attention", "--checkpoint", str(ckpt), "--src-file", str(src), "--html", "--beam", "3",
                 "--nbest", "2", "--out", str(tmp_path / "e.html"), "--bertviz", str(tmp_path / "b.pt")]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and (tmp_path / "b-1.pt").is_file() and (tmp_path / "b-2.pt").is_file()
    page = (tmp_path / "e.html").read_text(encoding="utf-8")
    start = page.index('id="explorer-data">') + len('id="explorer-data">')
    data = json.loads(page[start:page.index("</script>", start)])
    assert [len(item["hypotheses"]) for item in data["items"]] == [2, 2]
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    results = translator.translate(SOURCES, DecodeOptions(beam=3, nbest=2))
    assert [[h["text"] for h in item["hypotheses"]] for item in data["items"]] == \
        [[r.text, r.nbest[0].text] for r in results]
    inputs = torch.load(tmp_path / "b-1.pt", weights_only=True)
    best = bertviz_inputs(translation_views(translator, SOURCES[:1], DecodeOptions(beam=3, nbest=2))[0][0])
    assert inputs.keys() == best.keys() and inputs["decoder_tokens"] == best["decoder_tokens"]
    for name in ("encoder_attention", "decoder_attention", "cross_attention"):
        for got, ref in zip(inputs[name], best[name], strict=True):
            torch.testing.assert_close(got, ref)
    assert main(["plot", "attention", "--checkpoint", str(ckpt), "--src", "eins", "--html", "--beam", "2",
                 "--nbest", "3", "--out", str(tmp_path / "x.html")]) == 2
    assert "--nbest 3 is more than --beam 2" in capsys.readouterr().err
