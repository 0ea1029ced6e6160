"""Tiny random Marian models as Hugging Face writes them, for tests/test_marian*.py: the oracle is `transformers`
itself (MarianMTModel, MarianTokenizer), never attnkit's reading of the format.

A model folder holds what an opus-mt download holds: config.json and model.safetensors (MarianMTModel's own
save_pretrained), source.spm and target.spm (unigram sentencepiece models trained here, as Marian's are), vocab.json
(Marian's order: </s> 0, <unk> 1, the target-language tags of a multilingual model, the pieces, <pad> last) and
tokenizer_config.json.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

transformers = pytest.importorskip("transformers", reason="the Marian tests compare with transformers (attnkit[test])")
from transformers import MarianConfig, MarianMTModel, MarianTokenizer  # noqa: E402

from attnkit.checkpoint import Checkpoint  # noqa: E402
from attnkit.config import BOS_ID  # noqa: E402
from attnkit.data.tokenizer import SubwordTokenizer  # noqa: E402

SOURCE_TEXT = [
    "The cat sits on the mat.", "The dog sleeps in the garden.", "A man rides his bicycle over the bridge.",
    "Two children play football in the park.", "She reads a book about the sea.", "We will meet tomorrow at school.",
    "Der Hund schläft im Garten.", "Zwei Kinder spielen Fußball im Park.", "Ein Mann fährt Fahrrad über die Brücke.",
    "Le chat dort sur le canapé.", "Nous nous verrons demain à l'école.", "Numbers: 12, 345 and 6789!",
    "我们明天在学校见面。", "猫坐在垫子上。", "两个孩子在公园里踢足球。", "今日はとても良い天気です。",
    "The weather is very good today.", "Is this the way to the station?", "Where is the bus stop?",
]
TARGET_TEXT = [
    "猫坐在垫子上。", "狗在花园里睡觉。", "一个男人骑自行车过桥。", "两个孩子在公园里踢足球。",
    "她在读一本关于大海的书。", "我们明天在学校见面。", "今天天气很好。", "这是去车站的路吗？",
    "公共汽车站在哪里？", "数字：12、345 和 6789！",
    "The cat sits on the mat.", "The dog sleeps in the garden.", "Two children play football in the park.",
    "We will meet tomorrow at school.", "Where is the bus stop?",
]
# Sentences no model was trained on: Latin, German, French, Chinese, Japanese, digits, a character nothing knows (☃)
SAMPLE = ["The children meet in the park.", "Der Mann liest ein Buch.", "Le chien dort.", "我们在公园见面。",
          "今日は良い天気。", "Bus 42 at 6789!", "A snowman ☃ sleeps.", "station"]
TAGS = (">>cmn_Hans<<", ">>deu<<", ">>fra<<")
PAIRS = [(f"{TAGS[i % 3]} {s}", t) for i, (s, t) in enumerate(zip(SOURCE_TEXT, TARGET_TEXT * 2))]  # memorize's


@functools.cache
def train_spm(lines: tuple[str, ...], vocab_size: int) -> bytes:
    """A unigram sentencepiece model with sentencepiece's default ids (<unk> 0, <s> 1, </s> 2), as Marian's."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines * 3), model_writer=model, vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   num_threads=1, minloglevel=2)
    return model.getvalue()


def spm_pieces(blob: bytes) -> list[str]:
    """The pieces an spm produces (not its <unk>, <s>, </s>), in id order."""
    proc = spm.SentencePieceProcessor()
    proc.LoadFromSerializedProto(blob)
    return [proc.id_to_piece(i) for i in range(proc.get_piece_size())
            if not (proc.is_control(i) or proc.is_unknown(i))]


def marian_vocab(*spms: bytes, tags: tuple[str, ...] = (), drop: int = 0, pad: int = 0) -> dict[str, int]:
    """Marian's vocab.json: </s> 0, <unk> 1, the tags, the pieces of the spms, <pad> last (at id `pad` if that is
    further, after pieces no spm produces). `drop`: leave out that many pieces of the first spm, as a vocabulary built
    from a corpus lacks pieces it never saw (MarianTokenizer reads them as <unk>)."""
    pieces = [p for blob in spms for p in spm_pieces(blob)]
    left_out = set(spm_pieces(spms[0])[3 : 3 + 4 * drop : 4])
    names = ["</s>", "<unk>", *tags, *dict.fromkeys(p for p in pieces if p not in left_out)]
    names += [f"<unused_{i}>" for i in range(len(names), pad)]
    return {name: i for i, name in enumerate([*names, "<pad>"])}


def write_marian(folder: Path, *, activation: str = "swish", share: bool = True, tie: bool = True,
                 scale: bool = True, tags: tuple[str, ...] = (), bias: bool = True, drop: int = 2, seed: int = 0,
                 memorize: int = 0) -> Path:
    """A MarianMTModel folder with random weights: every parameter drawn (LayerNorm weights around 1), so that any
    tensor mapped wrongly changes the logits. `memorize`: then train this many steps on PAIRS, so that outputs are
    words that end (a random model repeats a token until the length limit)."""
    folder.mkdir(parents=True, exist_ok=True)
    src_spm, tgt_spm = train_spm(tuple(SOURCE_TEXT), 220), train_spm(tuple(TARGET_TEXT), 180)
    if share:
        src_vocab = tgt_vocab = marian_vocab(src_spm, tgt_spm, tags=tags, drop=drop)
    else:
        # one pad id for both (MarianConfig has one pad_token_id): the target's, after a gap of ids no piece holds
        src_vocab = marian_vocab(src_spm, tags=tags, drop=drop)
        tgt_vocab = marian_vocab(tgt_spm, pad=src_vocab["<pad>"])
    config = MarianConfig(
        vocab_size=src_vocab["<pad>"] + 1, decoder_vocab_size=tgt_vocab["<pad>"] + 1, d_model=16, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, activation_function=activation, scale_embedding=scale,
        share_encoder_decoder_embeddings=share, tie_word_embeddings=tie, dropout=0.0,
        pad_token_id=src_vocab["<pad>"], eos_token_id=0, decoder_start_token_id=tgt_vocab["<pad>"],
        forced_eos_token_id=0)
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.normal_(1.0 if "layer_norm.weight" in name else 0.0, 0.1 if memorize else 0.4)
        model.final_logits_bias.normal_(0.0, 1.0 if bias else 0.0)
    model.generation_config.bad_words_ids = [[tgt_vocab["<pad>"]]]  # as opus-mt's generation_config.json
    (folder / "source.spm").write_bytes(src_spm)
    (folder / "target.spm").write_bytes(tgt_spm)
    (folder / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False), encoding="utf-8")
    if not share:
        (folder / "target_vocab.json").write_text(json.dumps(tgt_vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "en", "target_lang": "zh", "separate_vocabs": not share}), encoding="utf-8")
    if memorize:
        _train(model, MarianTokenizer.from_pretrained(folder), memorize)
    model.save_pretrained(folder)
    return folder


def _train(model: MarianMTModel, tok: MarianTokenizer, steps: int) -> None:
    """Adam on PAIRS (the loss falls to about 0.01 in 120 steps, 2 s): a model that translates its training sources."""
    batch = tok([s for s, _ in PAIRS], text_target=[t for _, t in PAIRS], return_tensors="pt", padding=True)
    batch["labels"][batch["labels"] == tok.pad_token_id] = -100  # no loss on padding
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def load_marian(folder: Path) -> tuple[MarianMTModel, MarianTokenizer]:
    return MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder)


def to_marian(ckpt: Checkpoint, folder: Path, side: str) -> list[int | None]:
    """For each attnkit id of `side`, the Marian id MarianTokenizer gives its piece: vocab.json's id, <unk>'s for a
    piece vocab.json lacks; None for BOS, which Marian has not (its decoder starts from its pad)."""
    name = "target_vocab.json" if side == "tgt" and (folder / "target_vocab.json").exists() else "vocab.json"
    vocab = json.loads((folder / name).read_text(encoding="utf-8"))
    blob = ckpt.tokenizers.get(side, ckpt.tokenizers["src"])
    pieces = SubwordTokenizer.from_bytes(blob).pieces(list(range(SubwordTokenizer.from_bytes(blob).vocab_size)))
    out: list[int | None] = [vocab.get(p, vocab["<unk>"]) for p in pieces]
    out[BOS_ID] = None
    return out


def in_vocab(ckpt: Checkpoint, folder: Path, side: str) -> list[bool]:
    """Whether each attnkit id's piece is one vocab.json holds (its row is then that Marian id's)."""
    name = "target_vocab.json" if side == "tgt" and (folder / "target_vocab.json").exists() else "vocab.json"
    vocab = json.loads((folder / name).read_text(encoding="utf-8"))
    tok = SubwordTokenizer.from_bytes(ckpt.tokenizers.get(side, ckpt.tokenizers["src"]))
    return [p in vocab and i != BOS_ID for i, p in enumerate(tok.pieces(list(range(tok.vocab_size))))]
