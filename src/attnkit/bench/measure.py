"""The standard speed workloads of ../shared/bench/WORKLOADS.md, measured for attnkit and its peers.

Every measurement runs in a fresh interpreter, so its peak RSS is its own:

    python -m attnkit.bench.measure --toolkit attnkit --workload mt-train [--threads 2] [--dtype bfloat16] [--quick]

prints one JSON line per workload (`--workload` takes several, used by the quick smoke mode only);
`attnkit.bench.runner` starts these processes and builds the tables. A toolkit is a set of adapters
(build a model, get logits, generate), so one piece of code times every toolkit the same way:
attnkit's adapters are in `attnkit.bench.attnkit_adapter`, each peer's in a module of its own.

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
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from attnkit.bench.catalog import OPUS_WORKLOADS, TOOLKITS, TRAIN_WORKLOADS, WORKLOADS
from attnkit.bench.workloads import (
    QUICK,
    STANDARD,
    LMAdapter,
    LMShape,
    MTAdapter,
    MTShape,
    Shapes,
    Toolkit,
    TrainingContext,
    lm_eval_data,
    lm_train_batch,
    lm_train_data,
    mt_batch,
    mt_shape,
    opus_sources,
    plain_training,
)
from attnkit.runtime import autocast as device_autocast
from attnkit.runtime import peak_resident_mb

CPU = torch.device("cpu")


# --- timing, memory, FLOPs -------------------------------------------------------------------------
def timed(fn: Callable[[], object], warmup: int, runs: int, device: torch.device | None = None) -> float:
    """Median seconds of `runs` calls after `warmup` untimed ones. On a CUDA `device` every timed call ends when
    its kernels have run (they are launched asynchronously: unsynchronised, a call's time is its launches')."""

    def wait() -> None:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    wait()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def autocast(dtype: str, device: torch.device = CPU) -> contextlib.AbstractContextManager:
    """bf16 autocast (on the CPU unless told) for `--dtype bfloat16`; nothing for float32."""
    return device_autocast(device, dtype)


def _cpu_flash_flops(query, key, value, *args, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward_flops(grad_out, query, key, value, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _lstm_layer_flops(input, w_ih, w_hh, *args, **kwargs) -> int:
    """One LSTM layer's products over the sequence (the counter hands over shapes): the four gates from the input and
    from the state, 2 FLOPs a multiply-add; (B, T, I) or (T, B, I) alike."""
    gates, width = w_ih
    return 2 * input[0] * input[1] * gates * (width + w_hh[1])


def _lstm_layer_backward_flops(input, w_ih, w_hh, *args, **kwargs) -> int:
    return 2 * _lstm_layer_flops(input, w_ih, w_hh)  # the input's and the weights' gradients


# torch's counter knows the CUDA attention kernels but not the CPU one SDPA picks without dropout, and no
# recurrent kernel: the LSTM's fused cells (oneDNN's) are counted here.
STEP_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
    torch.ops.aten.mkldnn_rnn_layer: _lstm_layer_flops,
    torch.ops.aten.mkldnn_rnn_layer_backward: _lstm_layer_backward_flops,
}


def count_step_flops(model: nn.Module, loss_of: Callable[[], torch.Tensor]) -> int:
    """FLOPs of one forward + loss + backward (matrix products, attention with full S x T score matrices even
    when causal, LSTM cells); the optimiser update is not counted. Leaves the gradients cleared."""
    with FlopCounterMode(display=False, custom_mapping=STEP_FLOPS) as counter:
        loss_of().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def n_params(model) -> int:
    """Parameters of a module (tied weights count once), or the `params` an engine's model reports."""
    if isinstance(model, nn.Module):
        return sum(p.numel() for p in model.parameters())
    return model.params


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


def toolkit(name: str) -> Toolkit:
    """attnkit's adapters or a peer's, each in its own module of this package (`toolkit(variant)`)."""
    if name not in TOOLKITS:
        raise ValueError(f"unknown toolkit {name!r}; known: {', '.join(TOOLKITS)}")
    spec = TOOLKITS[name]
    return importlib.import_module(f"attnkit.bench.{spec.module}").toolkit(spec.variant)


# --- training throughput ---------------------------------------------------------------------------
@dataclass
class TrainCase:
    """A model and the loss of training step i; `tokens` = predicted tokens per step; `training`: what the
    library opens around its training steps (TrainingContext)."""

    model: nn.Module
    loss: Callable[[int, str], torch.Tensor]  # (step, dtype) -> scalar
    tokens: int
    steps: int  # batches the data holds (warm-up + timed)
    device: torch.device = CPU
    training: TrainingContext = plain_training


def mt_train_case(adapter: MTAdapter, s: MTShape, device: torch.device = CPU) -> TrainCase:
    model = adapter.build(s).to(device).train()
    src, tgt_in, tgt = (t.to(device) for t in mt_batch(s.train_batch, s))  # (B, S), (B, T), (B, T)

    def loss(i: int, dtype: str) -> torch.Tensor:
        with autocast(dtype, device):
            logits = adapter.logits(model, src, tgt_in)  # (B, T, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1), label_smoothing=0.1)

    return TrainCase(model, loss, tgt.numel(), s.warmup + s.steps, device, adapter.training)


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

    return TrainCase(model, loss, s.batch * s.segment, s.warmup + s.steps, training=adapter.training)


def train_throughput(case: TrainCase, warmup: int, dtype: str) -> dict:
    """Full steps (zero_grad .. opt.step) inside the library's training context, `warmup` untimed, the rest timed;
    then one counted step of the plain model."""
    opt = torch.optim.Adam(case.model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    step_i = 0

    def step() -> None:
        nonlocal step_i
        opt.zero_grad()
        case.loss(step_i, dtype).backward()
        opt.step()
        step_i += 1

    with case.training(case.model, case.device, case.tokens, dtype):
        sec = timed(step, warmup, case.steps - warmup, case.device)
    flops = count_step_flops(case.model, lambda: case.loss(case.steps - 1, dtype))  # full memory, last batch
    return {"tok_s": case.tokens / sec, "step_s": sec, "flops_per_step": flops, "gflop_s": flops / sec / 1e9}


# --- decoding and evaluation -----------------------------------------------------------------------
def mt_sources(n: int, s: MTShape) -> torch.Tensor:
    return mt_batch(n, s)[0]  # (n, S)


def mt_decode(adapter: MTAdapter, s: MTShape, beam: int, sources: Callable[[int, MTShape], torch.Tensor] = mt_sources,
              keep_outputs: bool = False, device: torch.device = CPU) -> dict:
    """Greedy (beam 1) or beam search: exactly T new tokens per source; one warm-up run, median of the rest.
    keep_outputs: the last run's output ids go into the result (`output_ids`, (n, T) as lists)."""
    model, rss_build = adapter.build(s).eval(), peak_resident_mb()
    if device != CPU:  # (the imported-Marian adapter's model is not a module: it decodes on the CPU)
        model = model.to(device)
    n = s.greedy_batch if beam == 1 else s.beam_batch
    src, last = sources(n, s).to(device), []  # (n, S)

    def run() -> None:
        with torch.no_grad():
            out = adapter.generate(model, src, beam, s.tgt_len)  # (n, T)
        if tuple(out.shape) != (n, s.tgt_len):
            raise RuntimeError(f"generated {tuple(out.shape)}, not {(n, s.tgt_len)}")
        last[:] = [out]

    sec = timed(run, 1, s.decode_runs, device)
    figures = {"tok_s": n * s.tgt_len / sec, "run_s": sec, "rss_after_build_mb": rss_build, "params": n_params(model)}
    return figures | ({"output_ids": last[0].tolist()} if keep_outputs else {})


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
    model, ids, rss_build = adapter.build(s).eval(), lm_eval_data(s), peak_resident_mb()
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
    model, ids, rss_build = adapter.build(s).eval(), lm_eval_data(s), peak_resident_mb()
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
    if workload in OPUS_WORKLOADS:  # every toolkit reads one Marian model; the outputs are compared (runner)
        if tk.marian is None:
            raise RuntimeError(f"{tk.name} has no adapter for Marian models")
        s = mt_shape(workload, shapes)
        return mt_decode(tk.marian, s, 1 if workload.endswith("-greedy") else s.beam, opus_sources, keep_outputs=True)
    if workload.startswith("mt-"):
        if tk.mt is None:
            raise RuntimeError(f"{tk.name} has no encoder-decoder adapter")
        s = mt_shape(workload, shapes)
        if workload == "mt-train":
            return train_figures(mt_train_case(tk.mt, s), s.warmup, dtype)
        return mt_decode(tk.mt, s, 1 if workload.endswith("-greedy") else s.beam)
    family, model = workload.split("-")[1:]  # lm-train-xl -> train, xl
    if model not in tk.lm:
        raise RuntimeError(f"{tk.name} has no {model} language model")
    if family == "train":
        return train_figures(lm_train_case(tk.lm[model], shapes.lm), shapes.lm.warmup, dtype)
    return (lm_eval_xl if model == "xl" else lm_eval_vanilla)(tk.lm[model], shapes.lm)


def train_figures(case: TrainCase, warmup: int, dtype: str) -> dict:
    rss_build = peak_resident_mb()
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
    return line | {"peak_rss_mb": peak_resident_mb(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def notes_of(tk: Toolkit, workload: str) -> str:
    if workload in OPUS_WORKLOADS:
        return tk.marian.notes if tk.marian else ""
    if workload.startswith("mt-"):
        return tk.mt.notes if tk.mt else ""
    adapter = tk.lm.get(workload.rsplit("-", 1)[1])
    return adapter.notes if adapter else ""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m attnkit.bench.measure",
                                 description="one standard-workload measurement")
    ap.add_argument("--toolkit", required=True, help="attnkit, attnkit-int8, a peer name, or 'machine' for matmul-peak")
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
