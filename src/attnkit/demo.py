"""The embedded default: German number words (or, with lang="zh", Chinese numerals) -> English, end to end in a
few minutes on a CPU.

corpus (num2words; attnkit's own Chinese numerals) -> prepare (sentencepiece) -> train (transformer-small) ->
translate the test set -> BLEU / exact match / samples -> an attention heatmap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnkit import config as cfgmod
from attnkit.data import prepare, read_lines, write_number_corpus
from attnkit.data.demo_corpus import EXAMPLES, check_language, spell
from attnkit.decode import Translator
from attnkit.eval import Scores, translate_and_score
from attnkit.io import atomic_write_text, ensure_new_output
from attnkit.train.trainer import Trainer
from attnkit.viz import plot_attention_heads

LANGUAGE_NAMES = {"de": "German", "zh": "Chinese"}
PRESETS = {"de": "demo", "zh": "demo-zh"}  # the same model; the budget of each is in its preset


@dataclass
class DemoResult:
    scores: Scores
    samples: list[tuple[str, str, str]]  # the README's examples from the test set: (source, hypothesis, reference)
    heatmap: Path
    checkpoint: Path


def readme_examples(translator: Translator, sources: list[str], texts: list[str],
                    lang: str = "de") -> list[tuple[str, str, str]]:
    """(source, translation, English) for the README's EXAMPLES: the test set's translations (the corpus
    puts them there), or translated now where a small test set left one out."""
    found = dict(zip(sources, texts))
    source, english = spell(EXAMPLES, lang)
    missing = [g for g in source if g not in found]
    found.update(zip(missing, translator.translate_texts(missing)))
    return [(g, found[g], e) for g, e in zip(source, english)]


def budget(t) -> str:
    """The training budget in words: updates (the same model on any CPU), with minutes only where the preset has
    them (then a slower CPU trains less)."""
    parts = [f"{t.max_epochs} epochs" if t.max_epochs else "", f"{t.max_steps:,} updates" if t.max_steps else "",
             f"{t.max_minutes:g} min" if t.max_minutes else ""]
    return ", at most ".join(p for p in parts if p) or "no limit"


def run_demo(out_dir: str | Path, *, lang: str = "de", overrides: list[str] = (), n_train: int = 24000,
             n_eval: int = 1000, force: bool = False, progress: bool = True, say=print) -> DemoResult:
    """The demo with `lang` (de or zh) number words as the source, trained on the preset PRESETS[lang]."""
    check_language(lang)
    out = ensure_new_output(out_dir, force, "demo folder")
    cfg = cfgmod.resolve([PRESETS[lang]], overrides)
    say(f"1/4 writing the {LANGUAGE_NAMES[lang]}->English number corpus ({n_train:,} train, {n_eval:,} dev, "
        f"{n_eval:,} test pairs) to {out}/corpus")
    files = write_number_corpus(out / "corpus", lang=lang, n_train=n_train, n_valid=n_eval, n_test=n_eval)
    say("2/4 training a sentencepiece vocabulary and encoding the corpus")
    # the languages are known: prepare records them and lets them choose the tokenizer's normalization
    report = prepare(out / "data", files["train"], files["valid"], files["test"], vocab_size=400, force=True,
                     src_lang=lang, tgt_lang="en")
    say(report.summary())
    say(f"3/4 training transformer-small: {budget(cfg.train)}")
    trainer = Trainer(cfg, out / "data", out, force=True, progress=progress)
    trainer.fit()
    say("4/4 translating the test set")
    translator = Translator.from_checkpoint(trainer.best_path, device=cfg.train.device)
    sources, refs = read_lines(files["test"][0]), read_lines(files["test"][1])
    hyps, scores = translate_and_score(translator, sources, refs, lang="en")  # the references are English
    texts = [h.text for h in hyps]
    atomic_write_text(out / "test.hyp", "\n".join(texts) + "\n")
    samples = readme_examples(translator, sources, texts, lang)
    # The README's first example: units before tens in German, after them in English, a crossing to see
    # (in Chinese the order is the English one: a diagonal).
    heatmap = out / "attention.png"
    h = translator.translate([samples[0][0]], need_attention=True)[0]
    plot_attention_heads(h.attention.transpose(0, 1), h.tgt_pieces + ["</s>"], h.src_pieces, heatmap,
                         title=f"cross-attention, last decoder layer: {samples[0][0]}")
    return DemoResult(scores, samples, heatmap, trainer.best_path)
