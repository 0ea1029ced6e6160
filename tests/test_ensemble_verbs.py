"""An ensemble (several --checkpoint files, `Translator.from_checkpoints`) in every verb that reads a translation
model: score, plot attention (PNG, --html, --stats), serve and its explorer, `translation_views`; its attention is
the mean of the members' maps where they are alike (the first member's where their kinds, layers or heads differ),
as every title says; export and language models refuse several checkpoints in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from attnkit.cli.main import main
from attnkit.decode import DecodeOptions, Ensemble, Translator
from attnkit.errors import AttnkitError
from attnkit.viz.attention import load_views, teacher_forced_views, translation_views
from conftest import serve_extra, tiny_run_config

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCES = ["einundzwanzig", "dreihundertvierundfünfzig"]
TARGETS = ["twenty-one", "three hundred fifty-four"]
MEAN_NOTE = "mean of the 2 ensemble members"


@pytest.fixture(scope="module")
def pair(family_checkpoints, data_dir, tmp_path_factory) -> list:
    """Two Transformers of one prepared corpus, trained from other seeds: an ensemble whose members are alike."""
    from attnkit.train.trainer import Trainer

    run = tmp_path_factory.mktemp("second") / "run"
    Trainer(tiny_run_config(max_steps=4, max_epochs=1, log_every=1, seed=7), data_dir, run, progress=False).fit()
    return [family_checkpoints["transformer"], run / "checkpoints" / "best.safetensors"]


@pytest.fixture(scope="module")
def translators(pair) -> tuple[Translator, list[Translator]]:
    return (Translator.from_checkpoints(pair, device="cpu"),
            [Translator.from_checkpoint(p, device="cpu") for p in pair])


def member_mean(members: list[Translator], source: str, tokens: list[int]) -> dict[str, list[np.ndarray]]:
    """Each member's own maps of one (source, output) pair, averaged member by member."""
    views = [teacher_forced_views(m, [source], m.encode_sources([source]), [tokens])[0] for m in members]
    return {k: [np.mean([v.maps[k][layer] for v in views], 0) for layer in range(len(views[0].maps[k]))]
            for k in views[0].maps}


def test_translation_views_of_an_ensemble_are_its_members_mean_and_its_alignments(translators):
    ens, members = translators
    options = DecodeOptions(beam=3, nbest=2)
    items = translation_views(ens, SOURCES, options)
    results = ens.translate(SOURCES, options, need_attention=True)
    for hyps, result in zip(items, results):
        expected = [result, *result.nbest]
        assert [v.output for v in hyps] == [t.text for t in expected]
        for view, t in zip(hyps, expected):
            mean = member_mean(members, view.source, t.tokens)
            for kind in ("encoder", "decoder", "cross"):
                for got, want in zip(view.maps[kind], mean[kind], strict=True):
                    np.testing.assert_allclose(got, want, atol=1e-6)
            first = member_mean(members[:1], view.source, t.tokens)["cross"][-1]
            assert np.abs(view.maps["cross"][-1] - first).max() > 1e-3  # not the first member's alone
            # the alignments of `translate --print-alignment` (the search's step weights) are the same maps
            np.testing.assert_allclose(t.attention.numpy().transpose(1, 0, 2), view.maps["cross"][-1], atol=1e-4)
            assert view.title("cross") == f"encoder-decoder attention ({MEAN_NOTE})"


def test_members_that_differ_draw_the_first_members_maps(family_checkpoints):
    mixed = [family_checkpoints["transformer"], family_checkpoints["rnn-bahdanau"]]
    (view,) = load_views(mixed, SOURCES[:1], TARGETS[:1])
    (first,) = load_views(mixed[0], SOURCES[:1], TARGETS[:1])
    assert view.maps.keys() == first.maps.keys()
    for kind in view.maps:
        for got, want in zip(view.maps[kind], first.maps[kind], strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)
    assert view.note == "first of the 2 ensemble members: their kinds, layers or heads differ"
    assert view.title("encoder").endswith(f"({view.note})")


def test_score_with_several_checkpoints_scores_with_the_ensemble(pair, translators, tmp_path, capsys):
    ens, members = translators
    (tmp_path / "s.de").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    (tmp_path / "t.en").write_text("\n".join(TARGETS) + "\n", encoding="utf-8")
    assert main(["score", "--checkpoint", *map(str, pair), "--src", str(tmp_path / "s.de"), "--tgt",
                 str(tmp_path / "t.en"), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"{lp:.4f}" for lp in ens.score(SOURCES, TARGETS)]
    assert printed != [f"{lp:.4f}" for lp in members[0].score(SOURCES, TARGETS)]


def test_plot_attention_png_and_stats_state_and_draw_the_ensembles_attention(pair, translators, tmp_path, capsys):
    ens, members = translators
    png = tmp_path / "a.png"
    assert main(["plot", "attention", "--checkpoint", *map(str, pair), "--src", SOURCES[1], "--kind", "cross",
                 "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"output: {ens.translate(SOURCES[1:])[0].text}\n" in out and f"attention: {MEAN_NOTE}\n" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (view,) = load_views(pair, SOURCES[1:], TARGETS[1:])  # what the verb draws, for a given target
    mean = member_mean(members, SOURCES[1], ens.tgt_tok.encode(TARGETS[1:])[0])
    for got, want in zip(view.maps["cross"], mean["cross"], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    (tmp_path / "s.de").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    assert main(["plot", "attention", "--checkpoint", *map(str, pair), "--stats", "--src-file",
                 str(tmp_path / "s.de")]) == 0
    assert f"attention: {MEAN_NOTE}\n" in capsys.readouterr().out


def test_plot_attention_html_of_an_ensemble_shows_its_hypotheses_and_says_whose_attention(pair, translators,
                                                                                          tmp_path):
    ens, _ = translators
    (tmp_path / "s.de").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "e.html"
    assert main(["plot", "attention", "--checkpoint", *map(str, pair), "--src-file", str(tmp_path / "s.de"),
                 "--html", "--beam", "3", "--nbest", "2", "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    start = page.index('id="explorer-data">') + len('id="explorer-data">')
    data = json.loads(page[start:page.index("</script>", start)])
    assert MEAN_NOTE in data["title"] and f"<h1>{data['title']}</h1>" in page
    expected = translation_views(ens, SOURCES, DecodeOptions(beam=3, nbest=2))
    for item, hyps in zip(data["items"], expected, strict=True):
        assert [h["text"] for h in item["hypotheses"]] == [v.output for v in hyps]
        for got, view in zip(item["hypotheses"], hyps):
            for kind, maps in view.maps.items():
                assert got["kinds"][kind]["title"].endswith(f"({MEAN_NOTE})")
                np.testing.assert_allclose(np.asarray(got["kinds"][kind]["layers"]), np.stack(maps), atol=1e-4)


def test_serve_with_several_checkpoints_serves_the_ensemble(pair, translators):
    httpx = serve_extra()
    from serving import free_port

    ens, _ = translators
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", "--checkpoint", *map(str, pair), "--port",
                             str(port), "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            try:
                health = httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
        assert health.status_code == 200 and health.json()["model"] == Ensemble.kind
        got = httpx.post(f"{url}/translate", json={"texts": SOURCES, "beam": 3}, timeout=60).json()
        assert [t["text"] for t in got["translations"]] == [t.text for t in ens.translate(SOURCES, beam=3)]
        explored = httpx.post(f"{url}/explore", json={"text": SOURCES[1], "beam": 3, "nbest": 2}, timeout=60).json()
        (hyps,) = translation_views(ens, SOURCES[1:], DecodeOptions(beam=3, nbest=2))
        assert [h["text"] for h in explored["items"][0]["hypotheses"]] == [v.output for v in hyps]
        cross = explored["items"][0]["hypotheses"][0]["kinds"]["cross"]
        assert cross["title"] == f"encoder-decoder attention ({MEAN_NOTE})"
        np.testing.assert_allclose(np.asarray(cross["layers"]), np.stack(hyps[0].maps["cross"]), atol=1e-4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_export_refuses_several_checkpoints_in_one_line(pair, tmp_path, capsys):
    assert main(["export", "--checkpoint", *map(str, pair), "--out", str(tmp_path / "ct2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one network" in err and "attnkit average" in err
    assert not (tmp_path / "ct2").exists()


def test_language_models_are_drawn_and_served_one_at_a_time(family_checkpoints, capsys):
    xl = str(family_checkpoints["transformer-xl"])
    with pytest.raises(AttnkitError, match="draw one at a time"):
        load_views([xl, xl], ["ANNA: the cat"])
    assert main(["serve", "--checkpoint", xl, xl, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "serve one at a time (ensembles are of translation models)" in err
