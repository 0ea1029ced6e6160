"""int8 decoding (`Translator(quantize="int8")`, `--quantize int8`) against float32 on a trained model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnkit.cpu import int8_kernels, int8_scheme, int8_unavailable
from attnkit.cpu.packed import PackedWeights
from attnkit.decode import DecodeOptions, Translator
from attnkit.decode import options as options_module
from attnkit.errors import ConfigError
from conftest import serve_extra

pytestmark = pytest.mark.skipif(bool(int8_unavailable()), reason=int8_unavailable() or "int8 runs here")
SOURCES = ["drei hundert zwei", "sieben", "neun zehn", "vier tausend eins"]


@pytest.fixture(scope="module")
def checkpoint(request):
    """The suite's tiny trained model (tests/test_int8.py hands its own to the run of each kernel family)."""
    if given := os.environ.get("ATTNKIT_TEST_INT8_CHECKPOINT"):
        return Path(given)
    return request.getfixturevalue("trained")[1] / "checkpoints" / "best.safetensors"


def packed_weights(translator: Translator) -> PackedWeights:
    """The one cache the packed modules of the Translator's inference copy share."""
    (cache,) = {m.cache for m in translator.fast.modules() if isinstance(getattr(m, "cache", None), PackedWeights)}
    return cache


def test_int8_scores_stay_close_to_float32(checkpoint):
    exact = Translator.from_checkpoint(checkpoint, device="cpu")
    quantised = Translator.from_checkpoint(checkpoint, device="cpu", quantize="int8")
    assert (exact.quantize, quantised.quantize) == (None, "int8") and packed_weights(quantised).int8
    assert not packed_weights(exact).int8 and quantised.fast is not quantised.model
    targets = exact.translate_texts(SOURCES, beam=3)
    for a, b in zip(exact.score(SOURCES, targets), quantised.score(SOURCES, targets)):
        assert a != b and abs(a - b) < 0.05 * abs(a) + 0.05  # int8 products ran, and stayed close
    for t in quantised.translate(SOURCES, DecodeOptions(beam=3, nbest=2)):  # the searches run on int8 copies
        assert len(t.nbest) == 1 and t.norm_score >= t.nbest[0].norm_score  # nbest: the other hypotheses
    assert len(packed_weights(quantised)) > 0


def test_int8_falls_back_to_float32_with_the_reason(checkpoint, monkeypatch):
    monkeypatch.setattr(options_module, "int8_unavailable", lambda: "this CPU has no AVX2")
    with pytest.warns(UserWarning, match="this CPU has no AVX2; decoding in float32"):
        t = Translator.from_checkpoint(checkpoint, device="cpu", quantize="int8")
    assert t.quantize is None and not packed_weights(t).int8


def test_an_unknown_quantization_is_a_config_error(checkpoint):
    with pytest.raises(ConfigError, match="quantize must be one of none, int8; got 'int4'"):
        Translator.from_checkpoint(checkpoint, device="cpu", quantize="int4")


def test_translate_quantize_int8_on_the_command_line(checkpoint, tmp_path, capsys):
    from attnkit.cli.main import main

    (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n")
    argv = ["translate", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "in.txt"), "--device", "cpu",
            "--format", "tsv", "--beam", "2"]
    assert main([*argv, "--quantize", "int8"]) == 0
    quantised = capsys.readouterr().out.splitlines()
    assert main(argv) == 0
    exact = capsys.readouterr().out.splitlines()
    assert quantised[0] == exact[0] and len(quantised) == len(exact) == 1 + len(SOURCES)  # header, one row each
    assert main([*argv, "--quantize", "int4"]) == 2  # a usage error, before any model loads
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_health_names_the_int8_kernels_the_service_runs(checkpoint):
    httpx = serve_extra()
    from attnkit.serve.app import create_app
    from serving import running

    with running(create_app(Translator.from_checkpoint(checkpoint, device="cpu", quantize="int8"))) as url:
        health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["quantize"] == "int8" and health["kernels"] == int8_kernels()
    words = {"full": "8-bit inputs (32-bit sums)", "inputs": "7-bit inputs (the kernels add pairs in 16 bits)",
             "weights": "8-bit inputs, 7-bit weights (the kernels add pairs in 16 bits)"}
    assert health["kernels"] == f"{torch.backends.quantized.engine} engine, {words[int8_scheme().name]}"
