"""The label-smoothed loss over the vocabulary: peak memory and time of one forward + backward, chunked (attnkit's
`label_smoothed_nll`) against the plain autograd path over a whole log-softmax (what it replaced); then the output
layer and the loss together, from its input h (N, --dim) and weights W (V, --dim): the logits made whole and the
chunked loss over them against `projected_label_smoothed_nll`, which makes them a
chunk at a time (bf16: autocast over float32 h and W, as in training).

    python benchmarks/loss_memory.py [--tokens 4096] [--vocab 8000] [--dim 256] [--runs 5]

Each (path, precision of the logits) runs in a fresh process: the logits are made, the peak resident set reset
(/proc/self/clear_refs), then the loss and its backward run --runs times; printed: the peak's growth over the
logits (MiB) and the median time (ms). As in training, the loss gets the logits as an intermediate result (here
`logits * 1`, a product's output in training) that it may let go of once its forward is done, and glibc keeps freed
memory for reuse as `attnkit train` has it keep it (`attnkit.cpu.keep_freed_memory`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_MEASURE = """
import json, statistics, sys, time
import torch
from attnkit.cpu import keep_freed_memory
from attnkit.train.losses import label_smoothed_nll, projected_label_smoothed_nll

def plain(logits, target, epsilon, ignore_index=0):  # the replaced path: autograd over a whole (N, V) log-softmax
    logp = logits.reshape(-1, logits.size(-1)).float().log_softmax(dim=-1)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    nll = -logp.gather(1, target[:, None]).squeeze(1)
    loss = ((1.0 - epsilon) * nll + epsilon * (-logp.mean(dim=-1))).masked_fill(~keep, 0.0).sum()
    return loss, nll.detach().masked_fill(~keep, 0.0).sum()

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

def whole_logits(h, weight, target, epsilon):  # the output layer's logits made whole, then the chunked loss
    return label_smoothed_nll(torch.nn.functional.linear(h, weight), target, epsilon)

def projected(h, weight, target, epsilon):
    return projected_label_smoothed_nll(h, weight, None, target, epsilon)

path, dtype, n, v, d, runs = sys.argv[1], getattr(torch, sys.argv[2]), *map(int, sys.argv[3:])
torch.set_num_threads(2)
keep_freed_memory()
gen = torch.Generator().manual_seed(0)
target = torch.randint(1, v, (n,), generator=gen)
if path in ("plain", "chunked"):  # the loss alone, from logits of `dtype`
    fn = plain if path == "plain" else label_smoothed_nll
    leaves = [torch.randn(n, v, generator=gen).to(dtype).requires_grad_()]
    autocast = False
else:  # the output layer and the loss, from float32 h and W (bf16: under autocast)
    fn = whole_logits if path == "logits" else projected
    leaves = [torch.randn(n, d, generator=gen).requires_grad_(),
              (torch.randn(v, d, generator=gen) / d**0.5).requires_grad_()]
    autocast = dtype == torch.bfloat16

def run(n_rows):  # loss + backward over the first n_rows rows, the first input a product's output as in training
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = fn(leaves[0][:n_rows] * 1, *leaves[1:], target[:n_rows], 0.1)[0]
    loss.backward()
    for x in leaves:
        x.grad = None

run(8)  # first-call allocations out of the way
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
times = []
for _ in range(runs):
    start = time.perf_counter()
    run(n)
    times.append(time.perf_counter() - start)
print(json.dumps({"peak_mib": (status("VmHWM:") - before) / 2**20, "ms": 1e3 * statistics.median(times)}))
"""


def measure(path: str, dtype: str, args: argparse.Namespace) -> dict:
    done = subprocess.run([sys.executable, "-c", _MEASURE, path, dtype, str(args.tokens), str(args.vocab),
                           str(args.dim), str(args.runs)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def table(paths: tuple[str, str], header: str, args: argparse.Namespace) -> None:
    print(header)
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dtype in ("float32", "bfloat16"):
        a, b = (measure(path, dtype, args) for path in paths)
        print(f"| {dtype} | {a['peak_mib']:,.0f} | {a['ms']:,.1f} | {b['peak_mib']:,.0f} | {b['ms']:,.1f} | "
              f"{a['peak_mib'] / max(b['peak_mib'], 1e-9):.1f}× | {a['ms'] / b['ms']:.2f}× |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dim", type=int, default=256, help="the output layer's input width")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{args.tokens:,} tokens x {args.vocab:,}: peak memory beyond the logits, median time of loss + backward")
    table(("plain", "chunked"), "| logits | plain: peak MiB | ms | chunked: peak MiB | ms | memory ÷ | time ÷ |", args)
    print(f"\nthe output layer ({args.dim} -> {args.vocab:,}) and the loss: peak memory beyond h and W, median time")
    table(("logits", "projected"), "| precision | whole logits: peak MiB | ms | projected: peak MiB | ms | memory ÷ | "
          "time ÷ |", args)


if __name__ == "__main__":
    main()
