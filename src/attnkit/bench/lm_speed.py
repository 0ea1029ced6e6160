"""The evaluation speed of Transformer-XL against the vanilla LM's sliding window, per attention length
(`attnkit lm speed`; the Transformer-XL paper's table 9).

W attention length, T XL segment, M XL memory.

Transformer-XL is timed as attnkit evaluates: the memory carries its keys and values from the segment that computed
them, and the position keys W_{k,R} R of the attention length it was computed at (the same M + T every segment once
the memory is full). With `recompute`, it is also timed as the XL reference evaluates: every segment projects the
memory's M positions again and the position keys of all M + T distances (`TransformerXL.forward(...,
reuse_keys=False)`), so both speed-ups come from one run.

Peak memory beside each length: on CUDA the most the two models allocated at that length (the counter reset before
it); on a CPU the process's peak resident memory after it (lengths are measured in ascending order, so a row's
growth over the one before is what that length needed beyond the others).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnkit.bench.measure import timed
from attnkit.config import TransformerXLConfig, replace
from attnkit.models import build_model
from attnkit.runtime import peak_resident_mb


@dataclass
class SpeedRow:
    attn_len: int  # W = M + T
    segment: int  # XL segment T
    memory: int  # XL memory M
    vanilla_ms: float  # per token, sliding window of W
    xl_ms: float  # per token, segment T over memory M (its keys and the position keys kept)
    peak_mb: float  # see the module's docstring
    xl_recompute_ms: float | None = None  # per token, the memory's keys and the position keys computed again

    @property
    def ratio(self) -> float:
        return self.vanilla_ms / self.xl_ms

    @property
    def recompute_ratio(self) -> float | None:
        return None if self.xl_recompute_ms is None else self.vanilla_ms / self.xl_recompute_ms


@torch.no_grad()
def speed_table(config: TransformerXLConfig, lengths: tuple[int, ...] = (128, 256, 512, 1024), *,
                segment_fraction: float = 0.25, runs: int = 5, device: torch.device | str = "cpu",
                recompute: bool = False) -> list[SpeedRow]:
    """Per-token evaluation time of the vanilla sliding window vs Transformer-XL, per attention length W.

    Vanilla: one forward pass over a window of W per predicted token (batch 1). XL: one segment of
    T = W * segment_fraction over a full memory of M = W - T per T tokens (segment 128 + memory 384 at
    W = 512, as the LM workload of ../shared/bench/WORKLOADS.md), as a stream carries it: the states and
    the keys/values of the last M positions; with `recompute` also without reading those keys/values or the kept
    position keys (the XL reference's way). Both models are built from `config`,
    randomly initialised (speed does not depend on the weights); median of `runs` timed calls.
    """
    device = torch.device(device)
    torch.manual_seed(0)
    vanilla = build_model("vanilla-lm", replace(config, kind="vanilla-lm")).to(device).eval()
    xl = build_model("transformer-xl", replace(config, kind="transformer-xl")).to(device).eval()
    rows = []
    for w in sorted(lengths):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t = max(1, int(w * segment_fraction))
        m = w - t
        window = torch.randint(config.vocab_size, (1, w), device=device)
        vanilla_s = timed(lambda window=window: vanilla(window), 1, runs, device)
        segment = torch.randint(config.vocab_size, (1, t), device=device)
        # the memory as streaming evaluation carries it: the states and their keys/values of M positions, and the
        # position keys of M + T from a segment read over a full memory
        _, mems = xl(torch.randint(config.vocab_size, (1, m), device=device), mem_len=m)
        _, mems = xl(segment, mems, mem_len=m)
        xl_s = timed(lambda segment=segment, mems=mems, m=m: xl(segment, mems, mem_len=m), 1, runs, device)
        again_s = None
        if recompute:
            again_s = timed(lambda segment=segment, mems=mems, m=m: xl(segment, mems, mem_len=m, reuse_keys=False),
                            1, runs, device)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_resident_mb()
        rows.append(SpeedRow(w, t, m, vanilla_s * 1e3, xl_s * 1e3 / t, peak,
                             None if again_s is None else again_s * 1e3 / t))
    return rows


def format_speed_table(rows: list[SpeedRow]) -> str:
    """The markdown table; with recomputed rows, the reference's way beside attnkit's (keys kept)."""
    again = all(r.xl_recompute_ms is not None for r in rows) and bool(rows)
    extra = " XL ms/token, recomputed | speed-up, recomputed |" if again else ""
    lines = ["| attention length | XL segment + memory | vanilla ms/token | XL ms/token | speed-up |" + extra
             + " peak memory (MB) |", "|---:|---:|---:|---:|---:|" + ("---:|---:|" if again else "") + "---:|"]
    for r in rows:
        cells = f"| {r.attn_len} | {r.segment} + {r.memory} | {r.vanilla_ms:.3f} | {r.xl_ms:.4f} | {r.ratio:.1f}x |"
        if again:
            cells += f" {r.xl_recompute_ms:.4f} | {r.recompute_ratio:.1f}x |"
        lines.append(cells + f" {r.peak_mb:,.0f} |")
    return "\n".join(lines)
