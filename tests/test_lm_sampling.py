"""Sampling from every language-model kind by the rule it was trained with (attnkit.decode.lm): the prompt shapes
every sampled token, no forward call reads positions beyond the training lengths, a long prompt gives the
distributions of a naive reference, and `attnkit lm generate`, `sample_text` (the service) and the attention
explorer read a text the same way. Tiny random models built here: no training needed to show the dependence."""

from __future__ import annotations

import pytest
import torch

from attnkit.checkpoint import LM_VOCAB, Checkpoint, save_checkpoint
from attnkit.cli.main import main
from attnkit.config import LMRunConfig, LMTrainConfig, RNNLMConfig, TransformerXLConfig
from attnkit.data.lm import LMVocab
from attnkit.decode.lm import sample_text
from attnkit.eval.lm import evaluate_segments
from attnkit.models import build_model
from attnkit.viz.attention import lm_views

pytestmark = pytest.mark.usefixtures("one_thread")

CHARS = "abcdefghijkl"  # one character per id, so a sampled text maps back to its ids
VOCAB = LMVocab("char", list(CHARS))
T = 6  # every run's training segment
LONG_PROMPT = "abcdefghijklkjihgfedcbaceg"  # 26 tokens: more than four segments
RUNS = {  # name -> (model kind, train config): the kinds and how each was trained
    "transformer-xl": ("transformer-xl", dict(mem_len=T, eval_mem_len=2 * T)),
    "no-recurrence": ("transformer-xl", dict(mem_len=0, eval_mem_len=0)),  # the *-no-recurrence presets
    "vanilla-lm": ("vanilla-lm", dict(mem_len=0, eval_mem_len=0)),
    "recurrent-vanilla-lm": ("recurrent-vanilla-lm", dict(mem_len=T, eval_mem_len=2 * T)),
    "lstm-lm": ("lstm-lm", dict(mem_len=T)),
}


def tiny_run(name: str, **train) -> tuple[torch.nn.Module, LMRunConfig]:
    kind, trained = RUNS[name]
    size = dict(kind=kind, vocab_size=len(CHARS), d_model=16, n_layers=2, dropout=0.0)
    model_cfg = RNNLMConfig(**size) if kind == "lstm-lm" else TransformerXLConfig(**size, n_heads=2, d_ff=32)
    cfg = LMRunConfig(model=model_cfg, train=LMTrainConfig(tgt_len=T, **{**trained, **train}))
    torch.manual_seed(0)
    return build_model(kind, model_cfg).double().eval(), cfg


def ids_of(text: str) -> list[int]:
    return [VOCAB.index[c] for c in text]


class Calls(list):
    """Every forward call of a model: (new tokens T, memory positions M it attends to, last logits (B, V))."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        forward = model.forward

        def recorded(x, mems=None, **kw):
            out = forward(x, mems, **kw)
            memory = mems[0].size(1) if mems and model.attends_to_memory else 0  # an LSTM's state is no positions
            self.append((x.size(1), memory, out[0][:, -1].detach()))
            return out

        model.forward = recorded


def sample(model, cfg, prompt: str, length: int, **options) -> tuple[list[int], list[torch.Tensor], Calls]:
    """sample_text's tokens, the logits each was drawn from (the last call before it) and every call."""
    calls, drawn_after = Calls(model), []
    text = sample_text(model, VOCAB, cfg, prompt, length, on_text=lambda _: drawn_after.append(len(calls)),
                       **options)
    del model.forward  # the class's forward again
    return ids_of(text), [calls[n - 1][2][0] for n in drawn_after], calls


def assert_within_training(calls: Calls, cfg: LMRunConfig) -> None:
    segment, memory = cfg.train.tgt_len, cfg.train.eval_lengths[1]  # these runs evaluate with tgt_len segments
    assert calls and all(t <= segment for t, _, _ in calls), [t for t, _, _ in calls]
    assert all(m <= memory for _, m, _ in calls), [m for _, m, _ in calls]


@pytest.fixture
def biased():
    """A model whose first sampled token is known: its output bias makes one token nearly certain."""

    def make(name: str):
        model, cfg = tiny_run(name)
        with torch.no_grad():
            model.softmax.bias[3] += 40.0
        return model, cfg

    return make


# --- (a) the prompt shapes the next tokens ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RUNS))
def test_the_prompt_changes_the_second_tokens_distribution(biased, name):
    model, cfg = biased(name)
    seconds = []
    for prompt in ("abca", "kbca"):  # the same but for the first token, all within the window
        tokens, logits, _ = sample(model, cfg, prompt, 2)
        assert tokens[0] == 3  # the same first sampled token after both prompts
        seconds.append(logits[1].log_softmax(-1))
    assert not torch.allclose(seconds[0], seconds[1], atol=1e-4), name


# --- (b) positions stay within training -------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RUNS))
def test_no_forward_call_reads_beyond_the_training_lengths(name):
    model, cfg = tiny_run(name)
    _, _, calls = sample(model, cfg, LONG_PROMPT, 3 * T + 1, seed=4)
    assert_within_training(calls, cfg)


@pytest.mark.parametrize("name", ["transformer-xl", "no-recurrence", "vanilla-lm", "recurrent-vanilla-lm"])
def test_the_explorer_reads_a_long_text_within_the_training_lengths(name):
    model, cfg = tiny_run(name)
    calls = Calls(model)
    (view,) = lm_views(model, VOCAB, cfg, [VOCAB.encode([LONG_PROMPT])[:-1]], continuation=0)
    assert_within_training(calls, cfg)
    queries, keys = len(view.queries["self"]), len(view.keys["self"])
    assert queries <= T and view.maps["self"][0].shape[1:] == (queries, keys)
    assert view.boundary.get("self", 0) == keys - queries <= cfg.train.eval_lengths[1]


# --- (c) a long prompt equals a naive reference ------------------------------------------------------------------
def full_context(model, cfg, context: list[int]) -> torch.Tensor:
    """The whole context in one call from nothing: what XL with a memory holding all of it and an LSTM carrying its
    state through all of it must give."""
    return model(torch.tensor([context]), mem_len=len(context))[0][0, -1]


def last_window(model, cfg, context: list[int]) -> torch.Tensor:
    """Al-Rfou et al.'s sliding window: the last tgt_len tokens read from scratch."""
    return model(torch.tensor([context[-cfg.train.tgt_len :]]))[0][0, -1]


@pytest.mark.parametrize(("name", "reference", "train"), [
    ("transformer-xl", full_context, dict(eval_mem_len=64)),  # a memory longer than the whole text
    ("lstm-lm", full_context, {}),
    ("no-recurrence", last_window, {}),
    ("vanilla-lm", last_window, {}),
])
def test_a_long_prompt_gives_the_references_distributions(name, reference, train):
    model, cfg = tiny_run(name, **train)
    tokens, logits, calls = sample(model, cfg, LONG_PROMPT, 2 * T + 3, seed=1)
    assert_within_training(calls, cfg)
    context = ids_of(LONG_PROMPT)
    with torch.no_grad():
        for token, got in zip(tokens, logits):
            torch.testing.assert_close(got.log_softmax(-1), reference(model, cfg, context).log_softmax(-1))
            context.append(token)


def test_the_recurrent_vanilla_lm_samples_from_what_evaluation_scores():
    """Segments of tgt_len from the text's start, memory carried: every sampled token's probability is the one
    `lm eval` (evaluate_segments) gives it at that place in the text."""
    model, cfg = tiny_run("recurrent-vanilla-lm")
    tokens, logits, _ = sample(model, cfg, LONG_PROMPT, 2 * T + 3, seed=2)
    text = torch.tensor(ids_of(LONG_PROMPT) + tokens)
    tgt_len, mem_len = cfg.train.eval_lengths
    scored = evaluate_segments(model, text, tgt_len=tgt_len, mem_len=mem_len, keep_tokens=True).token_nll[0]
    drawn = torch.stack([-got.log_softmax(-1)[token] for token, got in zip(tokens, logits)])
    torch.testing.assert_close(drawn.float(), scored[len(LONG_PROMPT) - 1 :].float())


# --- one rule for the CLI, the service and the explorer ----------------------------------------------------------
@pytest.mark.parametrize("name", list(RUNS))
def test_lm_generate_sample_text_and_the_explorer_continue_alike(tmp_path, capsys, name):
    model, cfg = tiny_run(name)
    model = model.float()
    path = tmp_path / "lm.safetensors"
    save_checkpoint(path, Checkpoint(kind=cfg.model.kind, config=cfg, model_state=model.state_dict(),
                                     tokenizers={LM_VOCAB: VOCAB.to_bytes()}))
    assert main(["lm", "generate", "--checkpoint", str(path), "--prompt", LONG_PROMPT, "--length", "15",
                 "--seed", "7", "--top-k", "6", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert printed == LONG_PROMPT + sample_text(model, VOCAB, cfg, LONG_PROMPT, 15, top_k=6, seed=7) + "\n"
    (view,) = lm_views(model, VOCAB, cfg, [VOCAB.encode([LONG_PROMPT])[:-1]], continuation=9)
    assert view.output == sample_text(model, VOCAB, cfg, LONG_PROMPT, 9, temperature=0.0)


def test_a_vanilla_window_longer_than_its_training_segment_is_refused(tmp_path, capsys):
    model, cfg = tiny_run("vanilla-lm")
    path = tmp_path / "lm.safetensors"
    save_checkpoint(path, Checkpoint(kind=cfg.model.kind, config=cfg, model_state=model.float().state_dict(),
                                     tokenizers={LM_VOCAB: VOCAB.to_bytes()}))
    assert main(["lm", "generate", "--checkpoint", str(path), "--prompt", "abc", "--mem-len", str(T + 1),
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"mem_len {T + 1}" in err and f"train.tgt_len {T}" in err and err.count("\n") == 1
