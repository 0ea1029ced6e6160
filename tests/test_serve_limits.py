"""Every route keeps the service's limits: /generate and the language model's /explore wait in a bounded queue (503
past --max-queue), get 504 when they cannot start in time, stream within the time limit and count in the metrics;
the LM service checks its memory budget at start; the translation explorer waits in the translation queue and
translates within the service's budget; a time-out is a 504 whichever class raised it. Real uvicorn servers on
loopback; a model whose forward pass waits for the test makes a request as slow as the test needs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest

from conftest import serve_extra  # noqa: E402

httpx = serve_extra()

from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402

from attnkit.checkpoint import load_lm_checkpoint  # noqa: E402
from attnkit.decode import DecodeOptions, Translator  # noqa: E402
from attnkit.decode.lm import sample_text  # noqa: E402
from attnkit.errors import ConfigError  # noqa: E402
from attnkit.serve import Batcher, create_app  # noqa: E402
from attnkit.serve.http import ApiError, Busy, ModelGate, answer  # noqa: E402
from attnkit.serve.lm_app import create_lm_app, lm_read_bytes  # noqa: E402
from conftest import LM_TEXT, LM_TINY  # noqa: E402
from serving import events, free_port, running  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "ANNA: the "


class Paced:
    """A language model's forward pass waits for `go` (set it to let the sampling run), then `delay` seconds:
    one forward pass per token, so a stream is as slow as the test wants."""

    def __init__(self, model, delay: float = 0.0, go: bool = False):
        self.go, self.delay = threading.Event(), delay
        if go:
            self.go.set()
        model.register_forward_pre_hook(self._wait)

    def _wait(self, *_):
        assert self.go.wait(30)
        time.sleep(self.delay)


@pytest.fixture(scope="module")
def xl_checkpoint(tmp_path_factory) -> Path:
    """A tiny Transformer-XL trained two steps on conftest's character-level text."""
    from attnkit import config as cfgmod
    from attnkit.data.lm import prepare_lm
    from attnkit.train.lm_trainer import LMTrainer

    root = tmp_path_factory.mktemp("xl")
    (root / "text.txt").write_text(LM_TEXT * 4, encoding="utf-8")
    prepare_lm(root / "data", root / "text.txt", level="char", valid_fraction=0.2)
    LMTrainer(cfgmod.resolve(["lm-char-small-xl"], LM_TINY, cls=cfgmod.LMRunConfig), root / "data", root / "run",
              progress=False).fit()
    return root / "run" / "checkpoints" / "best.safetensors"


@pytest.fixture
def lm(xl_checkpoint):
    """A fresh (model, vocab, config) of that checkpoint: each test puts its own hook on the model."""
    return load_lm_checkpoint(xl_checkpoint)


def generate(url: str, body: dict, started: threading.Event | None = None,
             timeout: float = 60) -> tuple[int, httpx.Headers, list]:
    """POST /generate: (status, headers, the events or, for a refusal, [("refused", its JSON)])."""
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=timeout) as r:
        if started is not None:
            started.set()
        if r.status_code != 200:
            r.read()
            return r.status_code, r.headers, [("refused", r.json())]
        return 200, r.headers, events(r)


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 15) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, f"{what} within {seconds:g} s"
        time.sleep(0.02)


def queue_depth(url: str) -> int:
    return httpx.get(f"{url}/health", timeout=10).json()["queue"]


def metric(url: str, series: str) -> float:
    """The value of one series (name and labels, exactly as /metrics prints them); 0 if absent."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def holding_the_model(pool: ThreadPoolExecutor, url: str, body: dict):
    """Start a /generate whose sampling then waits (the model's `go` not set): it holds the model."""
    started = threading.Event()
    future = pool.submit(generate, url, body, started)
    assert started.wait(15), "the first request did not start"
    return future


def test_generate_past_max_queue_is_refused_at_once_and_the_waiting_one_streams(lm):
    """The report: with --max-queue 1, four concurrent /generate were all answered 200, minutes later."""
    model, vocab, cfg = lm
    paced = Paced(model)
    body = {"prompt": PROMPT, "length": 20, "seed": 3}
    with running(create_lm_app(model, vocab, cfg, max_queue=1, request_timeout_s=30)) as url, \
            ThreadPoolExecutor(2) as pool:
        try:
            first = holding_the_model(pool, url, body)
            waiting = pool.submit(generate, url, body)
            wait_for(lambda: queue_depth(url) == 1, "the second request waits")
            start = time.monotonic()
            refused = [generate(url, body, timeout=10) for _ in range(2)]
            refused_within = time.monotonic() - start
        finally:
            paced.go.set()
        answered = [first.result(), waiting.result()]
        assert refused_within < 5  # at once, not after the model is free
        for status, headers, got in refused:
            assert status == 503 and int(headers["retry-after"]) >= 1 and "busy" in got[0][1]["error"], got
        expected = sample_text(model, vocab, cfg, PROMPT, 20, seed=3)
        for status, _, got in answered:
            assert status == 200 and got[-1] == ("done", {"text": expected}), got
            assert "".join(d["text"] for name, d in got if name == "token") == expected
        assert metric(url, 'attnkit_rejected_total{reason="queue_full"}') == 2
        assert metric(url, 'attnkit_requests_total{route="/generate",status="503"}') == 2
        assert metric(url, 'attnkit_streams_total{end="done"}') == 2
        assert metric(url, "attnkit_tokens_generated_total") == 40 and metric(url, "attnkit_queue_depth") == 0


def test_a_generate_that_cannot_start_in_time_gets_504_and_the_stream_holding_the_model_ends_at_the_limit(lm):
    model, vocab, cfg = lm
    paced = Paced(model)
    with running(create_lm_app(model, vocab, cfg, max_queue=4, request_timeout_s=1)) as url, \
            ThreadPoolExecutor(1) as pool:
        try:
            first = holding_the_model(pool, url, {"prompt": PROMPT, "length": 20})
            start = time.monotonic()
            status, _, got = generate(url, {"prompt": PROMPT, "length": 5}, timeout=10)
            waited = time.monotonic() - start
        finally:
            paced.go.set()
        assert status == 504 and "did not start within 1 s" in got[0][1]["error"], got
        assert 0.9 < waited < 5
        status, _, got = first.result()  # its time ran out while it waited for its first token
        assert status == 200 and got == [("error", {"error": "the time limit of 1 s ran out after 0 of 20 tokens",
                                                    "status": 504})]
        status, _, got = generate(url, {"prompt": PROMPT, "length": 5})  # the model is free again
        assert status == 200 and [name for name, _ in got] == ["token"] * 5 + ["done"]
        assert metric(url, 'attnkit_requests_total{route="/generate",status="504"}') == 1
        assert metric(url, 'attnkit_streams_total{end="time_limit"}') == 1


def test_the_time_limit_covers_the_whole_stream_which_ends_with_an_error_event(lm):
    model, vocab, cfg = lm
    Paced(model, delay=0.05, go=True)  # 64 tokens take over 3 s
    with running(create_lm_app(model, vocab, cfg, request_timeout_s=1, max_output_tokens=64)) as url:
        start = time.monotonic()
        status, _, got = generate(url, {"prompt": PROMPT, "length": 64, "seed": 5})
        took = time.monotonic() - start
        tokens = [d["text"] for name, d in got if name == "token"]
        assert status == 200 and 0 < len(tokens) < 64 and took < 2.5, (took, got)
        assert got[-1] == ("error", {"error": f"the time limit of 1 s ran out after {len(tokens)} of 64 tokens",
                                     "status": 504})
        assert sample_text(model, vocab, cfg, PROMPT, 64, seed=5).startswith("".join(tokens))
        assert metric(url, 'attnkit_streams_total{end="time_limit"}') == 1
        assert metric(url, "attnkit_stream_seconds_count") == 1


def test_lm_explore_waits_in_the_same_queue(lm):
    model, vocab, cfg = lm
    paced = Paced(model)
    with running(create_lm_app(model, vocab, cfg, max_queue=1, request_timeout_s=1)) as url, \
            ThreadPoolExecutor(2) as pool:
        try:
            holding_the_model(pool, url, {"prompt": PROMPT, "length": 5})
            waiting = pool.submit(httpx.post, f"{url}/explore", json={"text": PROMPT}, timeout=30)
            wait_for(lambda: queue_depth(url) == 1, "the explore waits")
            refused = httpx.post(f"{url}/explore", json={"text": PROMPT}, timeout=30)
            late = waiting.result()
        finally:
            paced.go.set()
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert late.status_code == 504 and "reading took too long" in late.json()["error"]
        assert httpx.post(f"{url}/explore", json={"text": PROMPT}, timeout=30).status_code == 200
        assert metric(url, 'attnkit_requests_total{route="/explore",status="503"}') == 1


def test_the_lm_service_refuses_to_start_when_the_largest_request_could_not_fit_its_budget(lm):
    model, vocab, cfg = lm
    memory = max(cfg.train.mem_len, cfg.train.eval_lengths[1])
    need = [lm_read_bytes(model.config, tokens=max(n + 1, cfg.train.tgt_len, *cfg.train.eval_lengths), memory=memory,
                          need_weights=True) for n in (100, 1000)]
    budget_mb = (need[0] + need[1]) / 2 / 2**20  # room for 100 characters, not for 1000
    with pytest.raises(ConfigError, match=r"^serve: a text of 1001 tokens \(--max-chars 1000\) .* raise "
                                          r"--memory-budget-mb$"):
        create_lm_app(model, vocab, cfg, memory_budget_mb=budget_mb, max_chars=1000)
    create_lm_app(model, vocab, cfg, memory_budget_mb=budget_mb, max_chars=100)


def test_the_serve_verb_gives_a_language_model_its_memory_budget(xl_checkpoint):
    done = subprocess.run([sys.executable, "-m", "attnkit", "serve", "--checkpoint", str(xl_checkpoint),
                           "--port", str(free_port()), "--device", "cpu",
                           "--memory-budget-mb", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "more than the memory budget of 1 MB" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


_MEASURE = """
import json, os, sys, torch
from attnkit.config import TransformerXLConfig
from attnkit.models import model_class
torch.set_num_threads(1)
def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))
def measure(kind, t, m, need_weights):
    torch.manual_seed(0)
    cfg = TransformerXLConfig(kind=kind, vocab_size=100, d_model=64, n_heads=4, d_ff=128, n_layers=2, dropout=0.0)
    model = model_class(kind).from_config(cfg).eval()
    x = torch.randint(4, 100, (1, m + t))
    with torch.no_grad():
        model(x[:, :3], None, mem_len=3, need_weights=need_weights)  # first-call allocations out of the way
        mems = model(x[:, :m], None, mem_len=m)[1] if m else None
        before = status("VmRSS:")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak (VmHWM) starts again from the current resident size
        model(x[:, m:], mems, mem_len=m, need_weights=need_weights)
    return status("VmHWM:") - before
used = []
for case in json.loads(sys.argv[1]):  # each in a fresh child: memory freed by one would hide the next one's peak
    read, write = os.pipe()
    if os.fork() == 0:
        os.write(write, str(measure(*case)).encode())
        os._exit(0)
    os.close(write)
    used.append(int(os.read(read, 64)))
    os.wait()
print(json.dumps(used))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_lm_estimate_bounds_the_memory_a_reading_takes():
    from attnkit.config import TransformerXLConfig

    cases = [(kind, tokens, memory, need_weights)
             for kind, tokens, memory in (("transformer-xl", 1200, 400), ("vanilla-lm", 1500, 0),
                                          ("recurrent-vanilla-lm", 1200, 400))
             for need_weights in (True, False)]
    done = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(cases)], capture_output=True, text=True,
                          check=True)
    for (kind, tokens, memory, need_weights), used in zip(cases, json.loads(done.stdout), strict=True):
        cfg = TransformerXLConfig(kind=kind, vocab_size=100, d_model=64, n_heads=4, d_ff=128, n_layers=2)
        estimate = lm_read_bytes(cfg, tokens=tokens, memory=memory, need_weights=need_weights)
        assert used <= estimate, (kind, need_weights, used, estimate)
        if need_weights:  # the explorer's reading: what the service's check at start estimates
            assert used > 50 * 2**20 and estimate <= 4 * used, (kind, used, estimate)


def test_the_gate_lets_one_in_lines_up_max_waiting_and_refuses_the_rest_of_a_burst():
    async def scenario() -> None:
        gate, release = ModelGate(max_waiting=1), threading.Event()
        callers = [asyncio.ensure_future(gate.enter(10)) for _ in range(4)]  # a burst at an open gate
        await asyncio.sleep(0.05)
        assert callers[0].done() and callers[0].result() is None  # the first takes it at once
        assert not callers[1].done() and gate.waiting == 1  # one waits
        assert all(isinstance(c.exception(), Busy) for c in callers[2:])  # the rest: 503 at once
        call = gate.start(release.wait, 10)
        release.set()
        await call
        await asyncio.wait_for(callers[1], 5)  # its turn came when the call ended
        assert gate.waiting == 0
        gate.start(lambda: None)
        await asyncio.wait_for(gate.enter(), 5)

    asyncio.run(scenario())


def test_a_caller_that_gives_up_leaves_the_line_and_never_takes_the_gate_with_it():
    async def scenario() -> None:
        gate, release = ModelGate(max_waiting=2), threading.Event()
        await gate.enter()
        call = gate.start(release.wait, 10)
        with pytest.raises(TimeoutError, match="not started within 0.05 s"):
            await gate.enter(0.05)
        assert gate.waiting == 0
        quitter = asyncio.ensure_future(gate.enter())  # (without a time-out, 3.11's wait_for cannot swallow the cancel)
        await asyncio.sleep(0.01)
        call.add_done_callback(lambda _: quitter.cancel())  # its turn comes, and it is cancelled before it runs
        release.set()
        await call
        with pytest.raises(asyncio.CancelledError):
            await quitter
        await asyncio.wait_for(gate.enter(), 5)  # the gate was passed on, not lost

    asyncio.run(scenario())


class HeldTranslator(Translator):
    """Records the memory budget of every translate() call, and waits for `go` before translating."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.go, self.budgets = threading.Event(), []

    def translate(self, sentences, options=None, **kw):
        self.budgets.append(kw.get("memory_budget"))
        assert self.go.wait(30)
        return super().translate(sentences, options, **kw)


@pytest.fixture
def held(trained) -> HeldTranslator:
    base = Translator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", "cpu")
    return HeldTranslator(base.model, base.src_tok, base.tgt_tok, device="cpu")


def test_translation_explore_waits_in_the_translation_queue(held):
    app = create_app(held, max_batch_sentences=1, batch_wait_ms=0, max_queue=1, request_timeout_s=30)
    with running(app) as url, ThreadPoolExecutor(2) as pool:
        try:
            explores = [pool.submit(httpx.post, f"{url}/explore", json={"text": "eins"}, timeout=60)]
            wait_for(lambda: len(held.budgets) == 1, "the first explore is being translated")
            explores.append(pool.submit(httpx.post, f"{url}/explore", json={"text": "zwei"}, timeout=60))
            wait_for(lambda: queue_depth(url) == 1, "the second explore waits in the queue")
            refused = [httpx.post(f"{url}/explore", json={"text": "drei"}, timeout=10),
                       httpx.post(f"{url}/translate", json={"text": "drei"}, timeout=10)]  # one queue for both
        finally:
            held.go.set()
        for r in refused:
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
        for r in (f.result() for f in explores):
            assert r.status_code == 200 and r.json()["items"][0]["hypotheses"], r.text
        assert metric(url, 'attnkit_rejected_total{reason="queue_full"}') == 2


def test_translation_explore_is_translated_within_the_services_budget(held):
    held.go.set()
    with running(create_app(held, memory_budget_mb=300, max_beam=4)) as url:
        r = httpx.post(f"{url}/explore", json={"text": "eins zwei", "beam": 3, "nbest": 2}, timeout=60)
        assert r.status_code == 200, r.text
        assert held.budgets == [300 * 2**20]


def test_python_floor_is_the_one_the_tests_run_on():
    """The declared floor is no older than the interpreter running these tests, nor than any installed dependency
    allows: a floor below them was never tested (3.10's asyncio.TimeoutError is not the builtin one)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floor = _floor(project["requires-python"])
    assert sys.version_info[:2] >= floor, (sys.version_info, floor)
    for requirement in project["dependencies"] + project["optional-dependencies"]["serve"]:
        name = Requirement(requirement).name
        theirs = metadata.metadata(name).get("Requires-Python")
        if theirs:
            assert floor >= _floor(theirs), f"{name} {metadata.version(name)} needs Python {theirs}"


def _floor(spec: str) -> tuple[int, int]:
    """The oldest (major, minor) a Requires-Python specifier admits."""
    lows = [tuple(int(p) for p in s.version.split(".")[:2]) for s in SpecifierSet(spec) if s.operator in (">=", "~=")]
    return max(lows, default=(3, 0))


class TimingOut(Translator):
    """Its translate() raises the builtin TimeoutError, as a library call with its own time limit would."""

    def translate(self, sentences, options=None, **kw):
        raise TimeoutError("the kernel gave up")


def test_a_builtin_timeout_error_inside_a_batch_answers_504(trained):
    base = Translator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", "cpu")
    with running(create_app(TimingOut(base.model, base.src_tok, base.tgt_tok, device="cpu"))) as url:
        r = httpx.post(f"{url}/translate", json={"text": "eins"}, timeout=30)
        assert r.status_code == 504 and "the kernel gave up" in r.json()["error"], r.text


def test_a_timeout_is_504_when_asyncio_has_its_own_class_as_before_python_3_11(trained, monkeypatch):
    """Before 3.11 asyncio.TimeoutError was not the builtin: an `except asyncio.TimeoutError` let the builtin one
    through as a 500. Both classes are caught, so the answer is 504 either way."""
    base = Translator.from_checkpoint(trained[1] / "checkpoints" / "last.safetensors", "cpu")
    monkeypatch.setattr(asyncio, "TimeoutError", type("TimeoutError", (Exception,), {}))  # 3.10's asyncio

    async def ask() -> int:
        batcher = Batcher(TimingOut(base.model, base.src_tok, base.tgt_tok, device="cpu"), max_batch_sentences=4,
                          batch_wait_ms=0)
        await batcher.start()
        try:
            await answer(batcher.submit(["eins"], DecodeOptions(), False, timeout=10), "translation")
        except ApiError as e:
            return e.status
        finally:
            await batcher.stop()
        return 200

    assert asyncio.run(ask()) == 504
