"""Load on `attnkit serve`: C concurrent clients sending real Multi30k test sentences to a checkpoint.

    python benchmarks/serve_load.py --checkpoint runs/multi30k/checkpoints/avg5.safetensors \\
        --data ../shared/data/multi30k --out benchmarks/results/serve-load

1. translates the test sentences once with `attnkit translate` (greedy): the expected answers;
2. starts `attnkit serve` with the same checkpoint in its own process;
3. for each C (1, 8, 32, 128 by default) sends N requests of one sentence each from C asyncio clients
   (aiohttp: `pip install aiohttp`; httpx's client took a whole core of its own at 128 connections), each
   client sending its next request when the previous one is answered;
4. reports throughput, p50 / p99 latency, the server's peak resident memory during that phase (sampled
   every 20 ms from /proc), and the answers that differ from `attnkit translate` (must be 0);
5. writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import numpy as np

from attnkit.data import read_lines


def expected_translations(checkpoint: str, sentences: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src.txt", Path(tmp) / "out.txt"
        src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        subprocess.run([sys.executable, "-m", "attnkit", "translate", "--checkpoint", checkpoint, "--input", src,
                        "--output", out, "--device", "cpu"], check=True)
        return out.read_text(encoding="utf-8").splitlines()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def phase(url: str, pid: int, clients: int, requests: int, sentences: list[str], expected: list[str]) -> dict:
    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        todo.put_nowait(i % len(sentences))
    latencies, wrong, errors, peak = [], 0, 0, rss_mb(pid)
    done = asyncio.Event()

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal wrong, errors
        while not todo.empty():
            i = todo.get_nowait()
            start = time.perf_counter()
            async with http.post(f"{url}/translate", json={"text": sentences[i]}) as r:
                answer = await r.json()
            latencies.append(time.perf_counter() - start)
            if r.status != 200:
                errors += 1
            elif answer["translations"][0]["text"] != expected[i]:
                wrong += 1

    async def sample_memory() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.02)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:
        sampler = asyncio.create_task(sample_memory())
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        done.set()
        await sampler
    lat = np.array(latencies) * 1000
    return {"clients": clients, "requests": requests, "seconds": seconds, "requests_per_s": requests / seconds,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "peak_rss_mb": peak, "wrong": wrong, "errors": errors, "client_cpu_s": cpu}


def start_server(checkpoint: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", "--checkpoint", checkpoint, "--port",
                             str(port), "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            if proc.poll() is not None:
                raise SystemExit("attnkit serve exited before it answered /health") from None
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("attnkit serve did not answer /health within 60 s")


def table(rows: list[dict]) -> str:
    lines = ["| clients | requests | requests/s | p50 latency | p99 latency | server peak RSS | wrong answers "
             "| errors |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['clients']} | {r['requests']} | {r['requests_per_s']:.1f} | {r['p50_ms']:.0f} ms | "
                     f"{r['p99_ms']:.0f} ms | {r['peak_rss_mb'] / 1024:.2f} GB | {r['wrong']} | {r['errors']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", default="../shared/data/multi30k")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--requests", type=int, default=1000, help="requests per concurrency level")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--out", default="benchmarks/results/serve-load")
    args = ap.parse_args()
    sentences = read_lines(Path(args.data) / "test_2016_flickr.de.gz")
    expected = expected_translations(args.checkpoint, sentences)
    proc = start_server(args.checkpoint, args.port)
    rows = []
    try:
        for c in args.clients:
            rows.append(asyncio.run(phase(f"http://127.0.0.1:{args.port}", proc.pid, c, args.requests, sentences,
                                          expected)))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        proc.terminate()
        code = proc.wait(timeout=120)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"checkpoint": args.checkpoint, "server_exit": code,
                                                   "phases": rows}, indent=2) + "\n")
    (out / "results.md").write_text(table(rows) + f"\nServer exit status after SIGTERM: {code}.\n")
    print(table(rows) + f"server exit status after SIGTERM: {code}")


if __name__ == "__main__":
    main()
