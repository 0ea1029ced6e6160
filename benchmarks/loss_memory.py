"""The label-smoothed loss over the vocabulary: peak memory and time of one forward + backward, chunked (attnkit's
`label_smoothed_nll`) against the plain autograd path over a whole log-softmax (what it replaced).

    python benchmarks/loss_memory.py [--tokens 4096] [--vocab 8000] [--runs 5]

Each (path, precision of the logits) runs in a fresh process: the logits are made, the peak resident set reset
(/proc/self/clear_refs), then the loss and its backward run --runs times; printed: the peak's growth over the
logits (MiB) and the median time (ms). As in training, the loss gets the logits as an intermediate result (here
`logits * 1`, a product's output in training) that it may let go of once its forward is done, and glibc keeps freed
memory for reuse as `attnkit train` has it keep it (`attnkit.runtime.keep_freed_memory`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_MEASURE = """
import json, statistics, sys, time
import torch
from attnkit.runtime import keep_freed_memory
from attnkit.train.losses import label_smoothed_nll

def plain(logits, target, epsilon, ignore_index=0):  # the replaced path: autograd over a whole (N, V) log-softmax
    logp = logits.reshape(-1, logits.size(-1)).float().log_softmax(dim=-1)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    nll = -logp.gather(1, target[:, None]).squeeze(1)
    loss = ((1.0 - epsilon) * nll + epsilon * (-logp.mean(dim=-1))).masked_fill(~keep, 0.0).sum()
    return loss, nll.detach().masked_fill(~keep, 0.0).sum()

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

path, dtype, n, v, runs = sys.argv[1], getattr(torch, sys.argv[2]), *map(int, sys.argv[3:])
torch.set_num_threads(2)
keep_freed_memory()
fn = plain if path == "plain" else label_smoothed_nll
gen = torch.Generator().manual_seed(0)
target = torch.randint(1, v, (n,), generator=gen)
logits = torch.randn(n, v, generator=gen).to(dtype).requires_grad_()
fn(logits[:8], target[:8], 0.1)[0].backward()  # first-call allocations out of the way
logits.grad = None
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
times = []
for _ in range(runs):
    start = time.perf_counter()
    fn(logits * 1, target, 0.1)[0].backward()
    times.append(time.perf_counter() - start)
    logits.grad = None
print(json.dumps({"peak_mib": (status("VmHWM:") - before) / 2**20, "ms": 1e3 * statistics.median(times)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{args.tokens:,} tokens x {args.vocab:,}: peak memory beyond the logits, median time of loss + backward")
    print("| logits | plain: peak MiB | ms | chunked: peak MiB | ms | memory ÷ | time ÷ |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dtype in ("float32", "bfloat16"):
        got = {}
        for path in ("plain", "chunked"):
            done = subprocess.run([sys.executable, "-c", _MEASURE, path, dtype, str(args.tokens), str(args.vocab),
                                   str(args.runs)], capture_output=True, text=True, check=True)
            got[path] = json.loads(done.stdout)
        p, c = got["plain"], got["chunked"]
        print(f"| {dtype} | {p['peak_mib']:,.0f} | {p['ms']:,.1f} | {c['peak_mib']:,.0f} | {c['ms']:,.1f} | "
              f"{p['peak_mib'] / max(c['peak_mib'], 1e-9):.1f}× | {p['ms'] / c['ms']:.2f}× |")


if __name__ == "__main__":
    main()
