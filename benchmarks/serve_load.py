"""Load and faults on `attnkit serve`: C concurrent clients against a translation or a language-model checkpoint,
then bursts past the queue and the time limit on every route.

    python benchmarks/serve_load.py --checkpoint runs/multi30k/checkpoints/avg5.safetensors \\
        --data ../shared/data/multi30k --out benchmarks/results/serve-load
    python benchmarks/serve_load.py --checkpoint runs/shakespeare/xl/checkpoints/best.safetensors \\
        --data ../shared/data/tiny_shakespeare --out benchmarks/results/serve-load-lm

Load, on a server with the default settings:
1. the expected answers: a translation model's test sentences (test_2016_flickr) translated once with `attnkit
   translate` (greedy); for a language model, lines of the text's last tenth as prompts, each sampled in this process
   with `sample_text` (what `attnkit lm generate` and the service run) and a seed of its own, and read by `lm_views`
   (what /explore runs) for its greedy continuation;
2. starts `attnkit serve` with the checkpoint in its own process;
3. for each C (translation: 1, 8, 32, 128; language model: 1, 4, 16 by default) sends N requests from C asyncio
   clients (aiohttp: `pip install aiohttp`; httpx's client took a whole core of its own at 128 connections), each
   client sending its next request when the previous one is answered: /translate of one sentence; or /generate of
   --length tokens after a prompt (a stream: the time to its first token and to its end are both measured) and
   /explore of a line;
4. reports throughput, p50 / p99 latency, the server's peak resident memory during that phase (sampled every 20 ms
   from /proc), and the answers that differ from the expected ones (must be 0).

Faults, on a second server started with --max-queue 1 --request-timeout-s 2 (a small queue and a short limit, so
that both refusals happen; a language model's also with --max-output-tokens 1000, so that a stream outlasts the
limit even on a small model):
5. every route (/translate and /explore; /generate and /explore) gets a burst of B concurrent requests as long as
   the caps allow (the model busy for longer than the limit); each answer must be 200, 503 or 504, a 503 must come
   at once (within 1 s), no answer may take more than the limit + 1 s (a stream running at the limit ends with an
   error event: "cut"), and a small request after the burst must be answered 200, at once or after the 503s'
   Retry-After (a translation batch already running is not interrupted at the limit: its clients get 504, the
   worker finishes it);
6. writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import numpy as np

from attnkit.checkpoint import load_checkpoint, load_lm_checkpoint
from attnkit.config import family
from attnkit.data import read_lines
from attnkit.decode.lm import sample_text
from attnkit.viz.attention import lm_encode, lm_views

SLACK_S = 1.0  # how far past the time limit an answer may come (one batch or token, the network)
RECOVERY_S = 600.0  # how long after a burst the service may take to answer a small request again


@dataclass
class Outcome:
    """One request as a client saw it."""

    status: int
    right: bool = True  # the answer equals the expected one
    first_s: float | None = None  # a stream: seconds to its first token
    tokens: int = 0
    cut: bool = False  # a stream that ended with the time limit's error event
    error_event: bool = False  # a stream that ended with any error event
    retry_after: float = 1.0  # a 503's Retry-After


def expected_translations(checkpoint: str, sentences: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src.txt", Path(tmp) / "out.txt"
        src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        subprocess.run([sys.executable, "-m", "attnkit", "translate", "--checkpoint", checkpoint, "--input", src,
                        "--output", out, "--device", "cpu"], check=True)
        return out.read_text(encoding="utf-8").splitlines()


def lm_prompts(data: str, n: int) -> list[str]:
    """n distinct non-empty lines of the text's last tenth (the validation part of `attnkit lm prepare
    --valid-fraction 0.1`), at most 80 characters each."""
    path = Path(data)
    if path.is_dir():
        path = next(p for p in sorted(path.iterdir()) if p.name.startswith("input") or p.suffix in (".txt", ".gz"))
    lines = read_lines(path)
    seen: dict[str, None] = {}
    for line in lines[len(lines) * 9 // 10:]:
        if line.strip() and len(seen) < n:
            seen.setdefault(line[:80], None)
    return list(seen)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def read_events(r: aiohttp.ClientResponse, out: Outcome, start: float) -> list[tuple[str, dict]]:
    """The server-sent events of a /generate answer, noting the first token's time in `out`."""
    events, name, data = [], "message", ""
    async for raw in r.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and data:
            events.append((name, json.loads(data)))
            if name == "token" and out.first_s is None:
                out.first_s = time.perf_counter() - start
            name, data = "message", ""
    return events


async def post(http: aiohttp.ClientSession, url: str, body: dict, expected: Callable[[dict], bool] | str | None
               ) -> Outcome:
    """POST `body`; a stream (/generate) is read to its end and its text compared with `expected` (a string), a
    JSON answer passed to `expected` (a predicate)."""
    start = time.perf_counter()
    async with http.post(url, json=body) as r:
        out = Outcome(r.status, retry_after=float(r.headers.get("Retry-After", 1)))
        if r.status != 200:
            await r.read()
        elif r.content_type == "text/event-stream":
            events = await read_events(r, out, start)
            out.tokens = sum(name == "token" for name, _ in events)
            last, payload = events[-1] if events else ("none", {})
            out.error_event = last != "done"
            out.cut = last == "error" and payload.get("status") == 504
            out.right = last == "done" and payload["text"] == expected
        else:
            answer = await r.json()
            out.right = expected is None or expected(answer)
    return out


async def phase(pid: int, clients: int, requests: int, ask: Callable[[aiohttp.ClientSession, int],
                                                                        Awaitable[Outcome]]) -> dict:
    """N requests (`ask(http, i)`) from C clients; throughput, latencies, peak RSS, wrong answers, errors."""
    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        todo.put_nowait(i)
    latencies, outcomes, peak = [], [], rss_mb(pid)
    done = asyncio.Event()

    async def client(http: aiohttp.ClientSession) -> None:
        while not todo.empty():
            i = todo.get_nowait()
            start = time.perf_counter()
            outcomes.append(await ask(http, i))
            latencies.append(time.perf_counter() - start)

    async def sample_memory() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.02)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:
        sampler = asyncio.create_task(sample_memory())
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        done.set()
        await sampler
    lat = np.array(latencies) * 1000
    firsts = np.array([o.first_s for o in outcomes if o.first_s is not None] or [np.nan]) * 1000
    errors = sum(o.status != 200 or o.error_event for o in outcomes)
    return {"clients": clients, "requests": requests, "seconds": seconds, "requests_per_s": requests / seconds,
            "tokens_per_s": sum(o.tokens for o in outcomes) / seconds,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "p50_first_ms": float(np.percentile(firsts, 50)), "p99_first_ms": float(np.percentile(firsts, 99)),
            "peak_rss_mb": peak, "wrong": sum(o.status == 200 and not o.right for o in outcomes), "errors": errors,
            "client_cpu_s": cpu}


async def burst(url: str, route: str, body: dict, n: int, after: dict, limit_s: float) -> dict:
    """n concurrent requests of `body` at once, then `after` until it is answered 200, waiting as each 503's
    Retry-After says (the model may still be busy with work whose clients got 504): the statuses, the times, the
    checks. The service is idle again when it returns."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        async def timed(b: dict) -> tuple[Outcome, float]:
            start = time.perf_counter()
            out = await post(http, url + route, b, None)
            return out, time.perf_counter() - start

        answers = await asyncio.gather(*(timed(body) for _ in range(n)))
        start, recovered, refusals = time.perf_counter(), None, []
        while recovered is None and time.perf_counter() - start < RECOVERY_S:
            later, _ = await timed(after)
            if later.status == 200 and not later.error_event:
                recovered = time.perf_counter() - start
            else:
                refusals.append(later.status)
                await asyncio.sleep(later.retry_after if later.status == 503 else 0)
    statuses = [o.status for o, _ in answers]
    busy = [s for o, s in answers if o.status == 503] or [0.0]
    row = {"route": route, "burst": n, "ok": statuses.count(200), "busy": statuses.count(503),
           "late": statuses.count(504), "cut": sum(o.cut for o, _ in answers), "slowest_503_s": max(busy),
           "slowest_s": max(s for _, s in answers), "recovered_s": recovered, "refused_after": refusals}
    row["pass"] = (set(statuses + refusals) <= {200, 503, 504} and row["slowest_503_s"] < 1.0
                   and row["slowest_s"] <= limit_s + SLACK_S and recovered is not None)
    return row


def start_server(checkpoint: str, port: int, *options: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", "--checkpoint", checkpoint, "--port",
                             str(port), "--device", "cpu", *options], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
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


def stop(proc: subprocess.Popen) -> int:
    proc.terminate()
    return proc.wait(timeout=120)


class Translation:
    """The translation service's routes, requests and expected answers."""

    clients, requests = [1, 8, 32, 128], 1000
    fault_options: list[str] = []  # the default caps: 64 sentences at beam 16 outlast the limit

    def __init__(self, args: argparse.Namespace):
        self.sentences = read_lines(Path(args.data) / "test_2016_flickr.de.gz")
        self.expected = expected_translations(args.checkpoint, self.sentences)

    def routes(self, url: str) -> dict[str, Callable[[aiohttp.ClientSession, int], Awaitable[Outcome]]]:
        def translate(http: aiohttp.ClientSession, i: int) -> Awaitable[Outcome]:
            i %= len(self.sentences)
            return post(http, f"{url}/translate", {"text": self.sentences[i]},
                        lambda a: a["translations"][0]["text"] == self.expected[i])

        return {"/translate": translate}

    def bursts(self) -> dict[str, tuple[dict, dict]]:
        """Per route: the longest request the default caps allow, and a small one for after the burst."""
        longest = sorted(self.sentences, key=len)[-64:]
        return {"/translate": ({"texts": longest, "beam": 16}, {"text": self.sentences[0]}),
                "/explore": ({"text": longest[-1], "beam": 16, "nbest": 16}, {"text": self.sentences[0]})}


class LanguageModel:
    """The language-model service's routes, requests and expected answers."""

    clients, requests = [1, 4, 16], 64
    fault_options = ["--max-output-tokens", "1000"]  # a stream that outlasts the limit even on a small, fast model

    def __init__(self, args: argparse.Namespace):
        self.length = args.length
        self.prompts = lm_prompts(args.data, args.requests or self.requests)
        model, vocab, cfg = load_lm_checkpoint(args.checkpoint)
        self.expected = [sample_text(model, vocab, cfg, p, self.length, seed=i) for i, p in enumerate(self.prompts)]
        views = lm_views(model, vocab, cfg, [lm_encode(vocab, p) for p in self.prompts])
        self.continuations = [v.output for v in views]
        self.long_text = " ".join(self.prompts)[:1000]  # --max-chars' default

    def routes(self, url: str) -> dict[str, Callable[[aiohttp.ClientSession, int], Awaitable[Outcome]]]:
        def generate(http: aiohttp.ClientSession, i: int) -> Awaitable[Outcome]:
            i %= len(self.prompts)
            return post(http, f"{url}/generate", {"prompt": self.prompts[i], "length": self.length, "seed": i},
                        self.expected[i])

        def explore(http: aiohttp.ClientSession, i: int) -> Awaitable[Outcome]:
            i %= len(self.prompts)
            return post(http, f"{url}/explore", {"text": self.prompts[i]},
                        lambda a: a["items"][0]["hypotheses"][0]["text"] == self.continuations[i])

        return {"/generate": generate, "/explore": explore}

    def bursts(self) -> dict[str, tuple[dict, dict]]:
        return {"/generate": ({"prompt": self.prompts[0], "length": 1000}, {"prompt": self.prompts[0], "length": 5}),
                "/explore": ({"text": self.long_text}, {"text": self.prompts[0]})}


def load_table(rows: list[dict], stream: bool) -> str:
    if stream:
        lines = ["| route | clients | requests | requests/s | tokens/s | p50 first token | p99 first token "
                 "| p50 whole stream | p99 whole stream | server peak RSS | wrong answers | errors |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    else:
        lines = ["| route | clients | requests | requests/s | p50 latency | p99 latency | server peak RSS "
                 "| wrong answers | errors |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        head = f"| {r['route']} | {r['clients']} | {r['requests']} | {r['requests_per_s']:.1f} | "
        tail = f"{r['peak_rss_mb'] / 1024:.2f} GB | {r['wrong']} | {r['errors']} |"
        if stream:
            lines.append(head + f"{r['tokens_per_s']:.0f} | {r['p50_first_ms']:.0f} ms | {r['p99_first_ms']:.0f} ms | "
                                f"{r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | " + tail)
        else:
            lines.append(head + f"{r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | " + tail)
    return "\n".join(lines) + "\n"


def fault_table(rows: list[dict]) -> str:
    lines = ["| route | burst | 200 | 503 | 504 | streams cut at the limit | slowest 503 | slowest answer "
             "| a small request answered 200 after | pass |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        after = "never" if r["recovered_s"] is None else f"{r['recovered_s']:.2f} s"
        if r["refused_after"]:
            kinds = ", ".join(map(str, sorted(set(r["refused_after"]))))
            after += f" ({len(r['refused_after'])} refused first: {kinds})"
        lines.append(f"| {r['route']} | {r['burst']} | {r['ok']} | {r['busy']} | {r['late']} | {r['cut']} | "
                     f"{r['slowest_503_s']:.2f} s | {r['slowest_s']:.2f} s | {after} | "
                     f"{'yes' if r['pass'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a translation or a language-model checkpoint")
    ap.add_argument("--data", default="../shared/data/multi30k",
                    help="multi30k folder (translation), or the text whose lines are prompts (language model)")
    ap.add_argument("--clients", type=int, nargs="+", help="concurrency levels (default: 1 8 32 128; LM 1 4 16)")
    ap.add_argument("--requests", type=int, help="requests per level and route (default: 1000; LM 64)")
    ap.add_argument("--length", type=int, default=100, help="tokens per /generate in the load phases")
    ap.add_argument("--burst", type=int, default=4, help="concurrent requests per route in the fault check")
    ap.add_argument("--fault-max-queue", type=int, default=1)
    ap.add_argument("--fault-timeout-s", type=float, default=2.0)
    ap.add_argument("--faults-only", action="store_true", help="skip the load phases")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--out", default="benchmarks/results/serve-load")
    args = ap.parse_args()
    lm = family(load_checkpoint(args.checkpoint).kind, "checkpoint").task == "lm"
    service = LanguageModel(args) if lm else Translation(args)
    url = f"http://127.0.0.1:{args.port}"
    rows, code = [], None
    proc = start_server(args.checkpoint, args.port) if not args.faults_only else None
    try:
        for route, ask in service.routes(url).items() if proc else ():
            for c in args.clients or service.clients:
                row = asyncio.run(phase(proc.pid, c, args.requests or service.requests, ask))
                rows.append({"route": route, **row})
                print(load_table(rows[-1:], lm and route == "/generate").splitlines()[-1], flush=True)
    finally:
        if proc is not None:
            code = stop(proc)
    faults = []
    proc = start_server(args.checkpoint, args.port, "--max-queue", str(args.fault_max_queue), "--request-timeout-s",
                        str(args.fault_timeout_s), *service.fault_options)
    try:
        for route, (body, after) in service.bursts().items():
            faults.append(asyncio.run(burst(url, route, body, args.burst, after, args.fault_timeout_s)))
            print(fault_table(faults[-1:]).splitlines()[-1], flush=True)
    finally:
        fault_code = stop(proc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"checkpoint": args.checkpoint, "server_exit": code,
                                                   "phases": rows, "fault_server_exit": fault_code,
                                                   "fault_settings": {"max_queue": args.fault_max_queue,
                                                                      "request_timeout_s": args.fault_timeout_s,
                                                                      "options": service.fault_options},
                                                   "faults": faults}, indent=2) + "\n")
    tables = "".join(load_table([r for r in rows if r["route"] == route], lm and route == "/generate") + "\n"
                     for route in dict.fromkeys(r["route"] for r in rows))
    settings = " ".join(["--max-queue", str(args.fault_max_queue), "--request-timeout-s", f"{args.fault_timeout_s:g}",
                         *service.fault_options])
    text = (tables + (f"Server exit status after SIGTERM: {code}.\n\n" if rows else "")
            + f"Faults ({settings}):\n\n" + fault_table(faults)
            + f"\nServer exit status after SIGTERM: {fault_code}.\n")
    (out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
