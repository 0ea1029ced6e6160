"""Teacher forcing vs step-by-step inference, for one sentence.

S source length, N greedy steps, T teacher-forced positions, V vocabulary.

Inference feeds the decoder one token at a time: step t reads the token chosen at step t - 1 (BOS first),
keeps the keys and values of the earlier ones, and predicts the next. Training reads the whole target at
once (teacher forcing): the input is BOS + target, and the causal mask hides from position t every input
after it, so position t sees exactly what step t sees. With the greedy output as the target, the two paths
compute the same function on the same inputs, and their log-probabilities agree to float rounding (the
kernels and the summation order differ). With another target (`--tgt`, e.g. a reference translation),
they read the same inputs only up to the first token where the target leaves the greedy output; from there
teacher forcing conditions on the target's token, inference on its own choice (exposure bias).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit.config import family
from attnkit.data.tokenizer import BOS_ID, EOS_ID
from attnkit.decode import DecodeOptions
from attnkit.decode.search import StepRules, max_lengths
from attnkit.viz.figure import Plot, finish, subplots


@dataclass
class DecodingTrace:
    """One sentence decoded both ways. Token lists hold ids; `pieces` turns them into labels."""

    source: str
    step_inputs: list[int]  # N: what step t reads (BOS, then the previous step's choice)
    step_outputs: list[int]  # N: what step t chose (the greedy output, EOS last unless the length limit hit)
    step_logp: np.ndarray  # (N, V) the model's log-probabilities at each step
    forced_inputs: list[int]  # T: BOS + the target, read in one pass
    forced_outputs: list[int]  # T: the choice at each position of that pass
    forced_logp: np.ndarray  # (T, V)
    self_attention: np.ndarray | None  # (T, T) last decoder layer, heads averaged; None for RNN decoders
    pieces: dict[int, str]  # id -> label

    @property
    def compared(self) -> int:
        """Positions both paths computed."""
        return min(len(self.step_inputs), len(self.forced_inputs))

    def gaps(self) -> np.ndarray:
        """(min(N, T),) max |log p_step - log p_forced| over the vocabulary at each position (finite entries)."""
        n = self.compared
        diff = np.abs(self.step_logp[:n] - self.forced_logp[:n])
        return np.where(np.isfinite(diff), diff, 0.0).max(1)

    def first_input_difference(self) -> int | None:
        """The first position whose input differs between the two paths (None: they read the same)."""
        return next((i for i in range(self.compared) if self.step_inputs[i] != self.forced_inputs[i]), None)

    def differing_predictions(self) -> list[int]:
        return [i for i in range(self.compared) if self.step_outputs[i] != self.forced_outputs[i]]

    def label(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    def summary(self) -> list[str]:
        """What the picture states: where the two paths read and predict the same, and where not."""
        gaps, first = self.gaps(), self.first_input_difference()
        lines = [f"greedy: {len(self.step_inputs)} steps, teacher forcing: one pass over {len(self.forced_inputs)} "
                 f"positions"]
        same = self.compared if first is None else first
        if same:
            where = "position 1" if same == 1 else f"positions 1-{same}"
            lines.append(f"{where}: same inputs, log-probs agree to {gaps[:same].max():.1e}")
        if first is not None:
            lines.append(f"position {first + 1}: teacher forcing reads {self.pieces[self.forced_inputs[first]]!r}, "
                         f"inference its own choice {self.pieces[self.step_inputs[first]]!r}; from there the "
                         "inputs differ")
        elif len(self.step_inputs) != len(self.forced_inputs):
            lines.append(f"the target is {'longer' if len(self.forced_inputs) > same else 'shorter'} than the "
                         f"greedy output (positions {same + 1}- exist in one path only)")
        differ = self.differing_predictions()
        lines.append("predictions differ at positions " + ", ".join(str(i + 1) for i in differ) if differ
                     else "predictions agree at every position both computed")
        return lines


def _choose(rules: StepRules, logp: torch.Tensor, t: int, history: list[int]) -> int:
    """The greedy choice at output position t from the raw log-probs (V,), under the search's rules
    (length limit, no PAD / BOS); `logp` is left as the model returned it."""
    constrained = rules.apply(logp[None].clone(), t, torch.tensor([history], dtype=torch.long, device=logp.device))
    return int(constrained[0].argmax())


@torch.no_grad()
def greedy_steps(model, src: torch.Tensor, rules: StepRules) -> tuple[list[int], list[int], np.ndarray]:
    """Greedy search written out: src (1, S) -> (inputs, choices, log-probs (N, V)), one step at a time."""
    state = model.init_state(model.encode(src))
    inputs, outputs, logps = [], [], []
    token = BOS_ID
    for t in range(int(rules.limits[0]) + 1):
        logp, state, _ = model.step(torch.tensor([token], device=src.device), state)  # (1, V)
        inputs.append(token)
        token = _choose(rules, logp[0], t, outputs)
        outputs.append(token)
        logps.append(logp[0].float().cpu().numpy())
        if token == EOS_ID:
            break
    return inputs, outputs, np.stack(logps)


@torch.no_grad()
def teacher_forced(model, src: torch.Tensor, target: list[int], rules: StepRules
                   ) -> tuple[list[int], list[int], np.ndarray, np.ndarray | None]:
    """One pass over BOS + target: (inputs, choices, log-probs (T, V), decoder self-attention (T, T) or None);
    the choices follow the same `rules` as the greedy steps (no PAD or BOS, EOS at the length limit)."""
    inputs = [BOS_ID, *target]
    tgt_in = torch.tensor([inputs], device=src.device)  # (1, T)
    # the maps when the model has any (an rnn-seq2seq has none): the Transformer's include the decoder's
    logits, maps = model.attention(src, tgt_in) if family(model.kind).attention else (model(src, tgt_in), {})
    logp = logits[0].float().log_softmax(-1)  # (T, V)
    choices = [_choose(rules, logp[t], t, target[:t]) for t in range(len(inputs))]
    decoder = maps.get("decoder")
    weights = None if not decoder else decoder[-1][0].mean(0).float().cpu().numpy()  # (H, T, T) -> (T, T)
    return inputs, choices, logp.cpu().numpy(), weights


def decoding_trace(translator, source: str, target: str | None = None) -> DecodingTrace:
    """Decode `source` greedily one step at a time, then teacher-force BOS + target through the decoder in one
    pass (default target: the greedy output itself)."""
    model = translator.model.eval()
    src = torch.tensor([translator.encode_sources([source])[0].tolist() + [EOS_ID]], device=translator.device)
    a, b, cap = translator.output_limit(DecodeOptions())
    rules = StepRules(max_lengths(src, a, b, cap))
    step_in, step_out, step_logp = greedy_steps(model, src, rules)
    tgt = [t for t in step_out if t != EOS_ID] if target is None else translator.tgt_tok.encode([target])[0]
    forced_in, forced_out, forced_logp, attention = teacher_forced(model, src, list(tgt), rules)
    ids = {*step_in, *step_out, *forced_in, *forced_out}
    pieces = dict(zip(sorted(ids), translator.tgt_tok.pieces(sorted(ids))))
    return DecodingTrace(source, step_in, step_out, step_logp, forced_in, forced_out, forced_logp, attention, pieces)


def _draw_steps(ax, trace: DecodingTrace) -> None:
    """Rows = steps, columns = decoder inputs: row t shades the prefix the decoder has read (fed at this step:
    dark; at earlier steps, now in the cache: light) and names, at the right, the token chosen with its probability."""
    n = len(trace.step_inputs)
    grid = np.full((n, n), np.nan)
    for t in range(n):
        grid[t, :t] = 0.35  # read at earlier steps: their keys and values come from the cache
        grid[t, t] = 1.0  # fed at this step
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    probs = np.exp(trace.step_logp[np.arange(n), trace.step_outputs])
    ax.set_xticks(range(n), trace.label(trace.step_inputs), rotation=90, fontsize=7, parse_math=False)
    ax.set_yticks(range(n), [f"step {t + 1}" for t in range(n)], fontsize=7)
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(n), [f"→ {p} ({q:.2f})" for p, q in zip(trace.label(trace.step_outputs), probs)],
                     fontsize=7, parse_math=False)
    ax.set(xlabel="input (BOS + its own earlier choices)",
           title="inference: one step at a time\n(dark: fed at this step; light: from the cache)")


def _draw_forced(ax, trace: DecodingTrace) -> None:
    """The single teacher-forced pass: the causal mask (with the last layer's self-attention inside it)."""
    t = len(trace.forced_inputs)
    mask = np.tril(np.ones((t, t)))
    weights = trace.self_attention if trace.self_attention is not None else mask
    ax.imshow(np.where(mask > 0, weights, np.nan), cmap="viridis", vmin=0, vmax=1, aspect="auto",
              interpolation="nearest")
    ax.imshow(np.where(mask > 0, np.nan, 1.0), cmap="Greys", vmin=0, vmax=1.6, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(t), trace.label(trace.forced_inputs), rotation=90, fontsize=7, parse_math=False)
    ax.set_yticks(range(t), [f"pos {i + 1}" for i in range(t)], fontsize=7)
    probs = np.exp(trace.forced_logp[np.arange(t), trace.forced_outputs])
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(t), [f"→ {p} ({q:.2f})" for p, q in zip(trace.label(trace.forced_outputs), probs)],
                     fontsize=7, parse_math=False)
    what = ("self-attention, last layer, heads averaged" if trace.self_attention is not None
            else "an RNN decoder: causal by its recurrence")
    ax.set(xlabel="input (BOS + target), all read at once",
           title=f"teacher forcing: one pass, causal mask\n({what}; grey: masked)")


def _draw_gaps(ax, trace: DecodingTrace) -> None:
    gaps, first = trace.gaps(), trace.first_input_difference()
    positions = np.arange(1, len(gaps) + 1)
    same = np.ones(len(gaps), dtype=bool) if first is None else positions <= first
    ax.bar(positions[same], np.maximum(gaps[same], 1e-12), color="tab:blue", label="same inputs")
    if not same.all():
        ax.bar(positions[~same], np.maximum(gaps[~same], 1e-12), color="tab:red", label="inputs differ")
    for i in trace.differing_predictions():
        ax.annotate("≠", (i + 1, max(gaps[i], 1e-12)), ha="center", va="bottom", color="tab:red", fontsize=11)
    ax.set(yscale="log", ylim=(1e-9, 1e2), xlabel="position", ylabel="max |Δ log p| over the vocabulary",
           title="inference vs teacher forcing\n(≠: the chosen tokens differ)")
    ax.set_xticks(positions)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, axis="y")


def plot_decoding(trace: DecodingTrace, path: str | Path | None) -> Plot:
    """Three panels: the steps of greedy inference, the teacher-forced pass with its causal mask, and the gap
    between their log-probabilities per position. data: the trace and its summary lines."""
    size = min(7.0, max(4.5, 0.3 * max(len(trace.step_inputs), len(trace.forced_inputs))))
    fig, axes = subplots(1, 3, size + 1.5, size)
    _draw_steps(axes[0, 0], trace)
    _draw_forced(axes[0, 1], trace)
    _draw_gaps(axes[0, 2], trace)
    summary = trace.summary()
    fig.suptitle(f"source: {trace.source}\n" + "\n".join(summary[1:]), fontsize=9, parse_math=False)  # text, not TeX
    return finish(fig, {"trace": trace, "summary": summary}, path)
