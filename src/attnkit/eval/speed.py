"""The standard speed workloads of ../shared/bench/WORKLOADS.md, measured for attnkit and its peers.

Every measurement runs in a fresh interpreter, so its peak RSS is its own:

    python -m attnkit.eval.speed --toolkit attnkit --workload mt-train [--threads 2] [--dtype bfloat16] [--quick]

prints one JSON line per workload (`--workload` takes several, used by the quick smoke mode only);
`attnkit.eval.bench` starts these processes and builds the tables. A toolkit is a set of adapters
(build a model, get logits, generate), so one piece of code times every toolkit the same way:
attnkit's adapters are here, the peers' in `attnkit.eval.peers`.

Shapes: B batch, S source length, T target / segment length, M memory length, W vanilla window,
V vocabulary, D model dim, N evaluation tokens.

Rules (WORKLOADS.md): 2 threads, `torch.manual_seed(0)`, synthetic data from fixed generators, loss
`F.cross_entropy` from the logits (label smoothing 0.1 for MT), `torch.optim.Adam(betas=(0.9, 0.98),
eps=1e-9)`, a training step timed from `zero_grad` to the end of `opt.step()`, medians. FLOPs of a
training step are counted by `torch.utils.flop_counter.FlopCounterMode` over one forward + loss +
backward (matrix products and attention; the Adam update, normalisation, softmax and element-wise
ops are not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

BOS, EOS = 1, 2  # WORKLOADS.md: PAD 0, BOS 1, EOS 2, UNK 3
# (family, what the row measures) per workload; peak RSS (MT (d)) is a column of every row.
WORKLOADS: dict[str, tuple[str, str]] = {
    "mt-train": ("mt", "(a) training, target tokens/s"),
    "mt-greedy": ("mt", "(b) greedy decoding, generated tokens/s"),
    "mt-beam5": ("mt", "(c) beam 5 decoding, generated tokens/s"),
    "lm-train-xl": ("lm", "(a) training, XL, memory carried"),
    "lm-train-vanilla": ("lm", "(a) training, vanilla"),
    "lm-eval-xl": ("lm", "(b-XL) evaluation, segments + memory"),
    "lm-eval-vanilla": ("lm", "(b-vanilla) evaluation, sliding window"),
}
TRAIN_WORKLOADS = ("mt-train", "lm-train-xl", "lm-train-vanilla")
Mems = list[torch.Tensor] | None  # per layer (B, M, D), or whatever the toolkit carries


# --- shapes ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MTShape:
    """Workload MT: encoder-decoder, shared vocabulary, tied embeddings, dropout 0.1."""

    vocab: int = 8000
    d_model: int = 256
    heads: int = 4
    ffn: int = 1024
    layers: int = 3  # encoder layers = decoder layers
    dropout: float = 0.1
    src_len: int = 24
    tgt_len: int = 24  # training target length and the exact number of generated tokens
    train_batch: int = 64
    greedy_batch: int = 64
    beam_batch: int = 16
    beam: int = 5
    warmup: int = 5
    steps: int = 20
    decode_runs: int = 3  # after one warm-up run


@dataclass(frozen=True)
class LMShape:
    """Workload LM: character-level decoder-only; XL = segment + memory, vanilla = window of `context`."""

    vocab: int = 256
    d_model: int = 256
    heads: int = 4
    ffn: int = 1024
    layers: int = 4
    dropout: float = 0.1
    batch: int = 32
    segment: int = 128
    memory: int = 384
    context: int = 512  # = segment + memory: the XL attention length and the vanilla window
    eval_tokens: int = 16384
    eval_warmup_segments: int = 8
    eval_passes: int = 3
    window_warmup: int = 8
    windows: int = 256
    warmup: int = 5
    steps: int = 20


@dataclass(frozen=True)
class Shapes:
    mt: MTShape = field(default_factory=MTShape)
    lm: LMShape = field(default_factory=LMShape)
    matmul: tuple[int, ...] = (1024, 2048, 4096)  # n x n x n products; the fastest rate is the machine's peak
    matmul_runs: int = 5  # after one warm-up
    quick: bool = False


STANDARD = Shapes()
# The smoke mode: tiny shapes that exercise every code path in seconds. NOT the standard workloads.
QUICK = Shapes(
    MTShape(vocab=64, d_model=32, heads=2, ffn=64, layers=1, src_len=6, tgt_len=6, train_batch=4, greedy_batch=4,
            beam_batch=2, warmup=1, steps=2, decode_runs=1),
    LMShape(d_model=32, heads=2, ffn=64, layers=1, batch=2, segment=16, memory=48, context=64, eval_tokens=64,
            eval_warmup_segments=1, eval_passes=1, window_warmup=1, windows=4, warmup=1, steps=2),
    matmul=(128, 256), matmul_runs=3, quick=True)


# --- data (WORKLOADS.md, "Synthetic data only") ----------------------------------------------------
def mt_batch(b: int, shape: MTShape = MTShape()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B, S), decoder input [BOS] + tgt[:, :-1] (B, T), labels tgt (B, T); ids 4 .. V-1."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, shape.vocab, (b, shape.src_len), generator=g)
    tgt = torch.randint(4, shape.vocab, (b, shape.tgt_len), generator=g)
    tgt_in = torch.cat([torch.full((b, 1), BOS), tgt[:, :-1]], 1)
    return src, tgt_in, tgt


def lm_train_data(shape: LMShape = LMShape()) -> torch.Tensor:
    """(B, n*T + 1) byte streams for the n = warm-up + timed steps of the training workload."""
    n = shape.warmup + shape.steps
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, shape.vocab, (shape.batch, n * shape.segment + 1), generator=g)


def lm_train_batch(data: torch.Tensor, i: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step i: input columns [i*T, i*T+T) (B, T) and the same shifted by one as labels (B, T)."""
    return data[:, i * t : i * t + t], data[:, i * t + 1 : i * t + t + 1]


def lm_eval_data(shape: LMShape = LMShape()) -> torch.Tensor:
    """(N + W + 1,) one stream: N scored tokens plus room for full windows."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, shape.vocab, (shape.eval_tokens + shape.context + 1,), generator=g)


# --- timing, memory, FLOPs -------------------------------------------------------------------------
def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn: Callable[[], object], warmup: int, runs: int) -> float:
    """Median seconds of `runs` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def autocast(dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on the CPU for `--dtype bfloat16`; nothing for float32."""
    from attnkit.runtime import autocast as device_autocast

    return device_autocast(torch.device("cpu"), dtype)


def _cpu_flash_flops(query, key, value, *args, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward_flops(grad_out, query, key, value, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# torch's counter knows the CUDA attention kernels but not the CPU one SDPA picks without dropout.
CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
}


def count_step_flops(model: nn.Module, loss_of: Callable[[], torch.Tensor]) -> int:
    """FLOPs of one forward + loss + backward (matrix products and attention, full S x T score matrices even
    when causal); the optimiser update is not counted. Leaves the gradients cleared."""
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        loss_of().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights count once


def matmul_rate(n: int, dtype: torch.dtype, runs: int) -> float:
    """GFLOP/s of an n x n x n product (2 n^3 FLOPs): median of `runs` after one warm-up."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))  # (n, n) each
    return 2 * n**3 / timed(lambda: torch.mm(a, b), 1, runs) / 1e9


def matmul_peak(shapes: Shapes, dtype: str) -> dict:
    """The machine's practical peak in the training precision: the fastest of a few square products."""
    dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    rates = {n: matmul_rate(n, dt, shapes.matmul_runs) for n in shapes.matmul}
    best = max(rates, key=rates.get)
    return {"gflop_s": rates[best], "n": best, "gflop_s_by_n": rates, "dtype": dtype}


# --- toolkits: what a workload needs from a library ------------------------------------------------
@dataclass(frozen=True)
class MTAdapter:
    build: Callable[[MTShape], nn.Module]
    logits: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # src (B, S), tgt_in (B, T) -> (B, T, V)
    generate: Callable[[nn.Module, torch.Tensor, int, int], torch.Tensor]  # src (B, S), beam, n_new -> (B, n_new)
    notes: str


@dataclass(frozen=True)
class LMAdapter:
    build: Callable[[LMShape], nn.Module]
    forward: Callable[[nn.Module, torch.Tensor, Mems, LMShape], tuple[torch.Tensor, Mems]]  # x (B, T) -> (B, T, V)
    notes: str


@dataclass(frozen=True)
class Toolkit:
    name: str
    version: str
    mt: MTAdapter | None = None
    lm: dict[str, LMAdapter] = field(default_factory=dict)  # "xl" and/or "vanilla"
    missing: dict[str, str] = field(default_factory=dict)  # workload -> why this toolkit cannot run it


# --- attnkit's adapters ----------------------------------------------------------------------------
def attnkit_mt_build(s: MTShape) -> nn.Module:
    from attnkit.config import TransformerConfig
    from attnkit.models import Transformer
    from attnkit.runtime import configure_backends

    configure_backends(torch.device("cpu"))  # as attnkit's trainers and Translator do
    return Transformer(TransformerConfig(src_vocab_size=s.vocab, tgt_vocab_size=s.vocab, d_model=s.d_model,
                                         n_heads=s.heads, d_ff=s.ffn, n_encoder_layers=s.layers,
                                         n_decoder_layers=s.layers, dropout=s.dropout, attention_dropout=s.dropout,
                                         activation_dropout=s.dropout))


def attnkit_mt_generate(model: nn.Module, src: torch.Tensor, beam: int, n_new: int) -> torch.Tensor:
    """Exactly n_new tokens per source (EOS blocked by min_len) -> (B, n_new)."""
    from attnkit.decode import beam_search, greedy_search

    kw = dict(max_len_a=0.0, max_len_b=n_new, min_len=n_new)
    hyps = greedy_search(model, src, **kw) if beam == 1 else beam_search(model, src, beam=beam, **kw)
    return torch.tensor([h[0].tokens for h in hyps])


def attnkit_lm_build(kind: str) -> Callable[[LMShape], nn.Module]:
    def build(s: LMShape) -> nn.Module:
        from attnkit.config import TransformerXLConfig
        from attnkit.models import build_model
        from attnkit.runtime import configure_backends

        configure_backends(torch.device("cpu"))
        cfg = TransformerXLConfig(kind=kind, vocab_size=s.vocab, d_model=s.d_model, n_heads=s.heads, d_ff=s.ffn,
                                  n_layers=s.layers, dropout=s.dropout, attention_dropout=s.dropout,
                                  max_positions=max(1024, s.context))
        return build_model(kind, cfg)

    return build


def attnkit_lm_forward(model: nn.Module, x: torch.Tensor, mems: Mems, s: LMShape) -> tuple[torch.Tensor, Mems]:
    return model(x, mems, mem_len=s.memory)  # logits (B, T, V), memory L x (B, <= M, D) (vanilla: [])


ATTNKIT = Toolkit(
    name="attnkit", version="",
    mt=MTAdapter(attnkit_mt_build, lambda model, src, tgt_in: model(src, tgt_in), attnkit_mt_generate,
                 "Transformer: post-LN, ReLU, sinusoidal positions, one table for source, target and output"),
    lm={"xl": LMAdapter(attnkit_lm_build("transformer-xl"), attnkit_lm_forward,
                        "TransformerXL: post-LN, ReLU, relative sinusoidal positions with u/v biases, tied"),
        "vanilla": LMAdapter(attnkit_lm_build("vanilla-lm"), attnkit_lm_forward,
                             "VanillaLM: post-LN, ReLU, absolute sinusoidal positions, tied")},
)


def toolkit(name: str) -> Toolkit:
    if name == "attnkit":
        from attnkit import __version__

        return dataclasses.replace(ATTNKIT, version=__version__)
    from attnkit.eval.peers import peer_toolkit

    return peer_toolkit(name)


# --- training throughput ---------------------------------------------------------------------------
@dataclass
class TrainCase:
    """A model and the loss of training step i; `tokens` = predicted tokens per step."""

    model: nn.Module
    loss: Callable[[int, str], torch.Tensor]  # (step, dtype) -> scalar
    tokens: int
    steps: int  # batches the data holds (warm-up + timed)


def mt_train_case(adapter: MTAdapter, s: MTShape) -> TrainCase:
    model = adapter.build(s).train()
    src, tgt_in, tgt = mt_batch(s.train_batch, s)  # (B, S), (B, T), (B, T)

    def loss(i: int, dtype: str) -> torch.Tensor:
        with autocast(dtype):
            logits = adapter.logits(model, src, tgt_in)  # (B, T, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1), label_smoothing=0.1)

    return TrainCase(model, loss, tgt.numel(), s.warmup + s.steps)


def lm_train_case(adapter: LMAdapter, s: LMShape) -> TrainCase:
    """XL carries its detached memory from step to step; vanilla sees each segment alone."""
    model = adapter.build(s).train()
    data, mems = lm_train_data(s), None  # (B, n*T + 1)

    def loss(i: int, dtype: str) -> torch.Tensor:
        nonlocal mems
        x, y = lm_train_batch(data, i, s.segment)  # (B, T) each
        with autocast(dtype):
            logits, mems = adapter.forward(model, x, mems, s)  # (B, T, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))

    return TrainCase(model, loss, s.batch * s.segment, s.warmup + s.steps)


def train_throughput(case: TrainCase, warmup: int, dtype: str) -> dict:
    """Full steps (zero_grad .. opt.step), `warmup` untimed, the rest timed; then one counted step."""
    opt = torch.optim.Adam(case.model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    step_i = 0

    def step() -> None:
        nonlocal step_i
        opt.zero_grad()
        case.loss(step_i, dtype).backward()
        opt.step()
        step_i += 1

    sec = timed(step, warmup, case.steps - warmup)
    flops = count_step_flops(case.model, lambda: case.loss(case.steps - 1, dtype))  # full memory, last batch
    return {"tok_s": case.tokens / sec, "step_s": sec, "flops_per_step": flops, "gflop_s": flops / sec / 1e9}


# --- decoding and evaluation -----------------------------------------------------------------------
def mt_decode(adapter: MTAdapter, s: MTShape, beam: int) -> dict:
    """Greedy (beam 1) or beam search: exactly T new tokens per source; one warm-up run, median of the rest."""
    model, rss_build = adapter.build(s).eval(), peak_rss_mb()
    n = s.greedy_batch if beam == 1 else s.beam_batch
    src, _, _ = mt_batch(n, s)  # (n, S)

    def run() -> None:
        with torch.no_grad():
            out = adapter.generate(model, src, beam, s.tgt_len)  # (n, T)
        if tuple(out.shape) != (n, s.tgt_len):
            raise RuntimeError(f"generated {tuple(out.shape)}, not {(n, s.tgt_len)}")

    sec = timed(run, 1, s.decode_runs)
    return {"tok_s": n * s.tgt_len / sec, "run_s": sec, "rss_after_build_mb": rss_build, "params": n_params(model)}


def summed_nll(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Cross-entropy of (..., V) logits against (...) targets, summed over positions."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum").item()


@torch.no_grad()
def xl_pass(adapter: LMAdapter, model: nn.Module, ids: torch.Tensor, s: LMShape, segments: int) -> float:
    """One stream (batch 1) in `segments` segments of T from an empty memory; every position scored."""
    mems, nll, t = None, 0.0, s.segment
    for k in range(segments):
        x, y = ids[k * t : k * t + t][None], ids[k * t + 1 : k * t + t + 1][None]  # (1, T) each
        logits, mems = adapter.forward(model, x, mems, s)  # (1, T, V)
        nll += summed_nll(logits, y)
    return nll


def lm_eval_xl(adapter: LMAdapter, s: LMShape) -> dict:
    """Warm-up over a few segments, then the median of full passes over N tokens; tokens/s = N / time."""
    model, ids, rss_build = adapter.build(s).eval(), lm_eval_data(s), peak_rss_mb()
    xl_pass(adapter, model, ids, s, s.eval_warmup_segments)
    segments = s.eval_tokens // s.segment
    nll = []
    sec = timed(lambda: nll.append(xl_pass(adapter, model, ids, s, segments)), 0, s.eval_passes)
    return {"tok_s": s.eval_tokens / sec, "run_s": sec, "est_s": sec, "nll_per_token": nll[-1] / s.eval_tokens,
            "rss_after_build_mb": rss_build, "params": n_params(model)}


@torch.no_grad()
def windows_pass(adapter: LMAdapter, model: nn.Module, ids: torch.Tensor, s: LMShape, first: int, count: int) -> float:
    """Windows r = first .. first+count-1: ids[r : r+W] (1, W) predicts ids[r+W], one prediction per forward."""
    nll, w = 0.0, s.context
    for r in range(first, first + count):
        logits, _ = adapter.forward(model, ids[r : r + w][None], None, s)  # (1, W, V)
        nll += summed_nll(logits[:, -1], ids[r + w][None])
    return nll


def lm_eval_vanilla(adapter: LMAdapter, s: LMShape) -> dict:
    """Al-Rfou sliding window: warm-up windows, then consecutive windows timed and extrapolated to N tokens."""
    model, ids, rss_build = adapter.build(s).eval(), lm_eval_data(s), peak_rss_mb()
    windows_pass(adapter, model, ids, s, 0, s.window_warmup)
    start = time.perf_counter()
    nll = windows_pass(adapter, model, ids, s, s.window_warmup, s.windows)
    sec = time.perf_counter() - start
    return {"tok_s": s.windows / sec, "run_s": sec, "est_s": s.eval_tokens * sec / s.windows,
            "nll_per_token": nll / s.windows, "rss_after_build_mb": rss_build, "params": n_params(model)}


# --- one measurement -------------------------------------------------------------------------------
def run_workload(tk: Toolkit, workload: str, shapes: Shapes, dtype: str) -> dict:
    """The workload's figures; raises where the toolkit cannot run it."""
    if workload in tk.missing:
        raise RuntimeError(tk.missing[workload])
    if workload.startswith("mt-"):
        if tk.mt is None:
            raise RuntimeError(f"{tk.name} has no encoder-decoder adapter")
        if workload == "mt-train":
            case = mt_train_case(tk.mt, shapes.mt)
            return train_figures(case, shapes.mt.warmup, dtype)
        return mt_decode(tk.mt, shapes.mt, 1 if workload == "mt-greedy" else shapes.mt.beam)
    family, model = workload.split("-")[1:]  # lm-train-xl -> train, xl
    if model not in tk.lm:
        raise RuntimeError(f"{tk.name} has no {model} language model")
    if family == "train":
        return train_figures(lm_train_case(tk.lm[model], shapes.lm), shapes.lm.warmup, dtype)
    return (lm_eval_xl if model == "xl" else lm_eval_vanilla)(tk.lm[model], shapes.lm)


def train_figures(case: TrainCase, warmup: int, dtype: str) -> dict:
    rss_build = peak_rss_mb()
    return train_throughput(case, warmup, dtype) | {"rss_after_build_mb": rss_build, "params": n_params(case.model)}


def measure(toolkit_name: str, workload: str, shapes: Shapes, dtype: str, threads: int) -> dict:
    """One JSON-ready result line: the figures, or `error`, plus the context every line records."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = dtype if workload in TRAIN_WORKLOADS or workload == "matmul-peak" else "float32"
    line = {"toolkit": toolkit_name, "workload": workload, "dtype": dtype, "quick": shapes.quick}
    try:
        if workload == "matmul-peak":
            line |= matmul_peak(shapes, dtype) | {"version": ""}
        else:
            tk = toolkit(toolkit_name)
            line |= {"version": tk.version, "notes": notes_of(tk, workload)}
            line |= run_workload(tk, workload, shapes, dtype)
    except Exception as e:  # a failure (a peer's bug, a missing module) is a result, not a crash
        line["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return line | {"peak_rss_mb": peak_rss_mb(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def notes_of(tk: Toolkit, workload: str) -> str:
    if workload.startswith("mt-"):
        return tk.mt.notes if tk.mt else ""
    adapter = tk.lm.get(workload.rsplit("-", 1)[1])
    return adapter.notes if adapter else ""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m attnkit.eval.speed", description="one standard-workload measurement")
    ap.add_argument("--toolkit", required=True, help="attnkit, a peer name, or 'machine' for matmul-peak")
    ap.add_argument("--workload", nargs="+", required=True, choices=[*WORKLOADS, "matmul-peak"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--quick", action="store_true", help="tiny smoke shapes, not the standard workloads")
    args = ap.parse_args(argv)
    shapes = QUICK if args.quick else STANDARD
    for workload in args.workload:
        print(json.dumps(measure(args.toolkit, workload, shapes, args.dtype, args.threads)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
