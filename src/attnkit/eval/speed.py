"""The standard speed workloads (../shared/bench/WORKLOADS.md) for attnkit's models.

Each measurement runs in a fresh Python subprocess (`python -m attnkit.eval.speed WORKLOAD`), so peak
RSS is that process's own; the parent collects one JSON line per measurement.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from attnkit.config import TransformerConfig
from attnkit.data.tokenizer import BOS_ID

MT_VOCAB, MT_LEN = 8000, 24


def mt_model_config() -> TransformerConfig:
    """Workload MT: d 256, 4 heads, FFN 1024, 3+3 layers, shared vocabulary 8000, tied, dropout 0.1."""
    return TransformerConfig(src_vocab_size=MT_VOCAB, tgt_vocab_size=MT_VOCAB, d_model=256, n_heads=4, d_ff=1024,
                             n_encoder_layers=3, n_decoder_layers=3, dropout=0.1, attention_dropout=0.1,
                             activation_dropout=0.1)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def mt_batch(b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, MT_VOCAB, (b, MT_LEN), generator=g)
    tgt = torch.randint(4, MT_VOCAB, (b, MT_LEN), generator=g)
    tgt_in = torch.cat([torch.full((b, 1), BOS_ID), tgt[:, :-1]], 1)
    return src, tgt_in, tgt


def timed(fn: Callable[[], None], warmup: int, runs: int) -> float:
    """Median seconds of `runs` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build_mt(dtype: str = "float32"):
    from attnkit.models import Transformer

    torch.manual_seed(0)
    return Transformer(mt_model_config())


def mt_train(dtype: str = "float32") -> dict:
    """(a) training throughput: B 64, 24 -> 24, full step, 5 warm-up + median of 20, target tokens/s."""
    from attnkit.runtime import autocast
    from attnkit.train.losses import label_smoothed_nll

    model = build_mt().train()
    rss_build = peak_rss_mb()
    src, tgt_in, tgt = mt_batch(64)
    opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    device = torch.device("cpu")

    def step() -> None:
        opt.zero_grad()
        with autocast(device, dtype):
            logits = model(src, tgt_in)
        loss, _ = label_smoothed_nll(logits, tgt, 0.1)
        (loss / tgt.numel()).backward()
        opt.step()

    sec = timed(step, 5, 20)
    return {"tok_s": 64 * MT_LEN / sec, "step_s": sec, "rss_after_build_mb": rss_build}


def mt_decode(beam: int) -> dict:
    """(b) greedy: 64 sources; (c) beam 5: 16 sources; exactly 24 new tokens (EOS blocked), median of 3."""
    from attnkit.decode import beam_search, greedy_search

    model = build_mt().eval()
    n = 64 if beam == 1 else 16
    src, _, _ = mt_batch(n)
    kw = dict(max_len_a=0.0, max_len_b=MT_LEN, min_len=MT_LEN)
    if beam == 1:
        def run() -> None:
            hyps = greedy_search(model, src, **kw)
            assert all(len(h[0].tokens) == MT_LEN for h in hyps)
    else:
        def run() -> None:
            hyps = beam_search(model, src, beam=beam, **kw)
            assert all(len(h[0].tokens) == MT_LEN for h in hyps)
    sec = timed(run, 1, 3)
    return {"tok_s": n * MT_LEN / sec, "run_s": sec}


WORKLOADS: dict[str, Callable[[], dict]] = {
    "mt-train": mt_train,
    "mt-train-bf16": lambda: mt_train("bfloat16"),
    "mt-greedy": lambda: mt_decode(1),
    "mt-beam5": lambda: mt_decode(5),
}


def run_in_subprocess(name: str, threads: int = 2) -> dict:
    """Measure one workload in a fresh interpreter; returns its JSON result."""
    out = subprocess.run([sys.executable, "-m", "attnkit.eval.speed", name, str(threads)], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        return {"workload": name, "error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    name, threads = argv[0], int(argv[1]) if len(argv) > 1 else 2
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    result = WORKLOADS[name]()
    result.update(workload=name, peak_rss_mb=peak_rss_mb(), torch=torch.__version__, threads=threads,
                  toolkit="attnkit")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
