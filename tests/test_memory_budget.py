"""Decoding within a memory budget: the estimate bounds what a search really takes, batches are cut to fit
(same translations), and a beam that cannot fit is a clear error, not a process killed by the kernel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnkit.config import TransformerConfig
from attnkit.decode import DecodeOptions, Translator
from attnkit.decode.memory import SearchShape, search_bytes
from attnkit.errors import ConfigError
from attnkit.models import Transformer

_MEASURE = """
import sys, torch
from attnkit.config import TransformerConfig
from attnkit.decode import beam_search
from attnkit.models import Transformer
vocab, beam, src_len, sentences = map(int, sys.argv[1:])
torch.manual_seed(0)
cfg = TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=64, n_heads=4, d_ff=128,
                        n_encoder_layers=2, n_decoder_layers=2, dropout=0.0)
model = Transformer(cfg).eval()
src = torch.randint(4, vocab, (sentences, src_len))
def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))
beam_search(model, src[:1, :3], beam=2, max_len_b=3)  # first-call allocations out of the way
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from the current resident size
beam_search(model, src, beam=beam, max_len_a=0, max_len_b=src_len, min_len=src_len)  # exactly src_len steps
print(status("VmHWM:") - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("vocab, beam, src_len, sentences", [(8000, 1024, 20, 1), (1000, 1024, 40, 2)])
def test_the_estimate_bounds_the_memory_a_beam_search_takes(vocab, beam, src_len, sentences):
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(vocab), str(beam), str(src_len), str(sentences)],
                          capture_output=True, text=True, check=True)
    used = int(done.stdout)
    cfg = TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=64, n_heads=4, d_ff=128,
                            n_encoder_layers=2, n_decoder_layers=2)
    estimate = search_bytes(SearchShape.of(cfg), sentences=sentences, expand=beam, src_len=src_len, out_len=src_len)
    assert used > 50 * 2**20  # the search did take memory worth measuring
    assert used <= estimate <= 4 * used, (used, estimate)


@pytest.fixture(scope="module")
def translator(trained) -> Translator:
    return Translator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", "cpu")


@pytest.fixture(scope="module")
def sources(corpus_files) -> list[str]:
    return corpus_files["test"][0].read_text(encoding="utf-8").splitlines()[:12]


def test_a_small_budget_cuts_batches_without_changing_a_translation(translator, sources):
    opts = DecodeOptions(beam=4, nbest=2)
    one_sentence = max(translator.search_bytes(1, len(ids) + 1, opts) for ids in translator.encode_sources(sources))
    whole = translator.translate(sources, opts)
    cut = translator.translate(sources, opts, memory_budget=one_sentence)
    assert [(t.text, [h.text for h in t.nbest]) for t in whole] == [(t.text, [h.text for h in t.nbest]) for t in cut]
    assert all(abs(a.score - b.score) < 1e-4 for a, b in zip(whole, cut, strict=True))


def test_a_beam_that_cannot_fit_is_refused_before_it_runs(translator, sources):
    with pytest.raises(ConfigError, match=r"^--beam 100000 needs about .* lower --beam$"):
        translator.translate(sources[:1], beam=100000, memory_budget=64 * 2**20)
    with pytest.raises(ConfigError, match="--nbest 5000"):
        translator.translate(sources[:1], sampling=True, nbest=5000, memory_budget=2**20)


def test_the_translate_command_says_so_in_one_line(trained, tmp_path, monkeypatch, capsys):
    from attnkit.cli.main import main
    from attnkit.decode import memory as module  # where the default budget reads the available memory

    monkeypatch.setattr(module, "available_memory", lambda device: 128 * 2**20)  # a small machine
    src = tmp_path / "in.txt"
    src.write_text("eins zwei\n")
    code = main(["translate", "--checkpoint", trained[1] / "checkpoints" / "last.safetensors", "--input", src,
                 "--output", tmp_path / "out.txt", "--beam", "100000", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("attnkit: error: --beam 100000 needs about") and "\n" not in err
    assert not (tmp_path / "out.txt").exists()


def test_outputs_stop_at_max_len_and_inside_the_position_table(trained):
    from attnkit.data import load_tokenizers

    src_tok, tgt_tok = load_tokenizers(trained[0])
    cfg = TransformerConfig(src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size, d_model=16,
                            n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_positions=12)
    small = Translator(Transformer(cfg), src_tok, tgt_tok, device="cpu")
    for opts in (DecodeOptions(max_len_b=100), DecodeOptions(beam=3, max_len_b=100), DecodeOptions(max_len_b=100,
                                                                                                     sampling=True)):
        (t,) = small.translate(["eins zwei drei"], opts)  # an untrained model runs to its limit
        assert len(t.tgt_pieces) <= 11
    (t,) = small.translate(["eins zwei drei"], DecodeOptions(max_len_b=100, max_len=3))
    assert len(t.tgt_pieces) <= 3
