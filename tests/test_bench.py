"""`attnkit bench`: FLOP counting, the WORKLOADS.md data rules, planning and skip notes, and a quick run end to end."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from attnkit.bench import catalog, huggingface, opus, plain, workloads
from attnkit.bench import measure as speed
from attnkit.bench import runner as bench
from attnkit.bench.attnkit_adapter import ATTNKIT
from attnkit.cli import bench as bench_cli
from attnkit.cli.main import main
from attnkit.cpu import int8_unavailable

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_MT = workloads.MTShape(vocab=50, d_model=32, heads=2, ffn=64, layers=2, src_len=5, tgt_len=7, train_batch=3)
LABEL = bench.TOOLKIT_LABELS


def mt_training_flops(s: workloads.MTShape) -> int:
    """Hand count of one training step's matrix-product FLOPs (2 per multiply-add).

    Forward: encoder layers (fused QKV + output projection + FFN on S tokens, scores and weighted sum
    over S x S), decoder layers (the same over T x T, cross-attention queries and output on T tokens,
    keys and values on the S source tokens, scores over T x S), the tied output projection. Backward:
    every product needs the gradients of both operands (the embeddings are trained), so twice the forward.
    """
    b, S, T, d, f, v, L = s.train_batch, s.src_len, s.tgt_len, s.d_model, s.ffn, s.vocab, s.layers
    encoder = 2 * b * S * (4 * d * d + 2 * d * f) + 2 * 2 * b * S * S * d
    decoder = (2 * b * T * (4 * d * d) + 2 * 2 * b * T * T * d  # self-attention
               + 2 * b * T * (2 * d * d) + 2 * b * S * (2 * d * d) + 2 * 2 * b * T * S * d  # cross-attention
               + 2 * b * T * (2 * d * f))  # FFN
    forward = L * (encoder + decoder) + 2 * b * T * d * v
    return 3 * forward


# --- FLOPs ---------------------------------------------------------------------------------------
def test_timings_on_cuda_wait_for_the_kernels(monkeypatch):
    """CUDA launches kernels asynchronously: a timed call must end with a synchronisation (the device's), the
    untimed warm-up too, or the figure is the launch time. The CPU path never synchronises."""
    synced, order = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: (synced.append(device), order.append("sync")))
    speed.timed(lambda: order.append("call"), 2, 3)
    assert synced == []
    speed.timed(lambda: order.append("call"), 2, 3, torch.device("cuda", 1))
    assert synced == [torch.device("cuda", 1)] * 4
    assert order == ["call"] * 5 + ["call", "call", "sync"] + ["call", "sync"] * 3


def test_flop_counter_matches_hand_count_of_a_linear_layer():
    torch.manual_seed(0)
    model, x = nn.Linear(8, 4), torch.randn(3, 8)  # forward 2*3*8*4; backward: weight gradient only
    assert speed.count_step_flops(model, lambda: model(x).sum()) == 2 * (2 * 3 * 8 * 4)
    assert model.weight.grad is None  # the count leaves no gradients behind
    x.requires_grad_(True)  # now the input gradient too
    assert speed.count_step_flops(model, lambda: model(x).sum()) == 3 * (2 * 3 * 8 * 4)


@pytest.mark.parametrize("dropout", [0.1, 0.0])  # 0.1: SDPA's math path; 0.0: the fused CPU kernel
def test_mt_step_flops_match_the_analytical_count(dropout):
    shape = dataclasses.replace(TINY_MT, dropout=dropout)
    torch.manual_seed(0)
    case = speed.mt_train_case(ATTNKIT.mt, shape)
    counted = speed.count_step_flops(case.model, lambda: case.loss(0, "float32"))
    assert counted == pytest.approx(mt_training_flops(shape), rel=0.01)


def test_hugging_face_mt_step_has_the_same_count():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    case = speed.mt_train_case(huggingface.HF_MT, TINY_MT)
    counted = speed.count_step_flops(case.model, lambda: case.loss(0, "float32"))
    assert counted == pytest.approx(mt_training_flops(TINY_MT), rel=0.01)


def test_train_throughput_reports_flop_rate():
    torch.manual_seed(0)
    case = speed.mt_train_case(ATTNKIT.mt, dataclasses.replace(TINY_MT, warmup=1, steps=2))
    out = speed.train_throughput(case, 1, "float32")
    assert out["flops_per_step"] == pytest.approx(mt_training_flops(TINY_MT), rel=0.01)
    assert out["gflop_s"] == pytest.approx(out["flops_per_step"] / out["step_s"] / 1e9)
    assert out["tok_s"] == pytest.approx(3 * 7 / out["step_s"])


# --- WORKLOADS.md: shapes and data rules ---------------------------------------------------------
def test_standard_shapes_are_the_documented_ones():
    mt, lm = workloads.STANDARD.mt, workloads.STANDARD.lm
    assert (mt.vocab, mt.d_model, mt.heads, mt.ffn, mt.layers, mt.dropout) == (8000, 256, 4, 1024, 3, 0.1)
    assert (mt.train_batch, mt.src_len, mt.tgt_len, mt.warmup, mt.steps) == (64, 24, 24, 5, 20)
    assert (mt.greedy_batch, mt.beam_batch, mt.beam, mt.decode_runs) == (64, 16, 5, 3)
    assert (lm.vocab, lm.d_model, lm.heads, lm.ffn, lm.layers, lm.dropout) == (256, 256, 4, 1024, 4, 0.1)
    assert (lm.batch, lm.segment, lm.memory, lm.context, lm.warmup, lm.steps) == (32, 128, 384, 512, 5, 20)
    assert (lm.eval_tokens, lm.eval_warmup_segments, lm.eval_passes) == (16384, 8, 3)
    assert (lm.window_warmup, lm.windows) == (8, 256)
    assert not workloads.STANDARD.quick and workloads.QUICK.quick


@pytest.mark.parametrize("b", [64, 16])
def test_mt_data_follows_the_generator_rule(b):
    src, tgt_in, tgt = workloads.mt_batch(b, workloads.STANDARD.mt)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(src, torch.randint(4, 8000, (b, 24), generator=g))
    assert torch.equal(tgt, torch.randint(4, 8000, (b, 24), generator=g))
    assert torch.equal(tgt_in[:, 0], torch.full((b,), 1)) and torch.equal(tgt_in[:, 1:], tgt[:, :-1])


def test_lm_training_data_follows_the_generator_rule():
    data = workloads.lm_train_data(workloads.STANDARD.lm)
    n = 5 + 20
    assert torch.equal(data, torch.randint(0, 256, (32, n * 128 + 1), generator=torch.Generator().manual_seed(0)))
    for i in (0, 7, n - 1):
        x, y = workloads.lm_train_batch(data, i, 128)
        assert x.shape == y.shape == (32, 128)
        assert torch.equal(x, data[:, i * 128 : i * 128 + 128]) and torch.equal(y, data[:, i * 128 + 1 : i * 128 + 129])


def test_lm_evaluation_data_follows_the_generator_rule():
    ids = workloads.lm_eval_data(workloads.STANDARD.lm)
    assert torch.equal(ids, torch.randint(0, 256, (16384 + 512 + 1,), generator=torch.Generator().manual_seed(1)))


def test_xl_memory_is_carried_and_detached_in_training():
    shape, seen = dataclasses.replace(workloads.QUICK.lm, steps=4), []  # 5 batches of segment 16, memory 48
    xl = ATTNKIT.lm["xl"]

    def recording_forward(model, x, mems, s):
        seen.append(None if mems is None else (mems[0].size(1), any(m.requires_grad for m in mems)))
        return xl.forward(model, x, mems, s)

    torch.manual_seed(0)
    case = speed.lm_train_case(workloads.LMAdapter(xl.build, recording_forward, xl.notes), shape)
    for i in range(5):
        case.loss(i, "float32").backward()
    assert seen == [None, (16, False), (32, False), (48, False), (48, False)]


@pytest.mark.parametrize("workload", ["mt", "xl"])
def test_attnkit_trains_inside_its_cpu_training_scope(workload):
    """The timed steps run with the modules attnkit's trainer swaps in (attnkit.cpu.training_scope), as
    `attnkit train` does; the counted step and the model afterwards are the plain ones."""
    torch.manual_seed(0)
    if workload == "mt":
        case = speed.mt_train_case(ATTNKIT.mt, dataclasses.replace(workloads.QUICK.mt, warmup=1, steps=1))
    else:
        case = speed.lm_train_case(ATTNKIT.lm["xl"], dataclasses.replace(workloads.QUICK.lm, warmup=1, steps=1))
    seen, loss = [], case.loss

    def recording_loss(i, dtype):
        seen.append({type(m).__module__ for m in case.model.modules() if "Dropout" in type(m).__name__})
        return loss(i, dtype)

    speed.train_throughput(dataclasses.replace(case, loss=recording_loss), 1, "float32")
    assert seen[:2] == [{"attnkit.cpu.dropout"}] * 2 and seen[2:] == [{"torch.nn.modules.dropout"}]
    assert all(type(m) is nn.Dropout for m in case.model.modules() if "Dropout" in type(m).__name__)


LSTM_TOOLKITS = {"attnkit": ATTNKIT, "pytorch": plain.toolkit()}


@pytest.mark.parametrize("name", list(LSTM_TOOLKITS))
def test_lstm_state_is_carried_and_detached_in_training(name):
    shape, seen = dataclasses.replace(workloads.QUICK.lm, steps=3), []  # 4 batches of segment 16
    lstm = LSTM_TOOLKITS[name].lm["lstm"]

    def recording_forward(model, x, mems, s):
        seen.append(None if mems is None else [(tuple(m.shape), m.requires_grad) for m in mems])
        logits, new = lstm.forward(model, x, mems, s)
        assert logits.shape == (*x.shape, s.vocab)
        return logits, new

    torch.manual_seed(0)
    case = speed.lm_train_case(workloads.LMAdapter(lstm.build, recording_forward, lstm.notes), shape)
    for i in range(4):
        case.loss(i, "float32").backward()
    state = ((shape.layers, shape.batch, shape.d_model), False)  # (h, c): (L, B, D) each, cut from the graph
    assert seen == [None, *[[state, state]] * 3]


def test_attnkit_and_the_plain_loop_do_the_same_lstm_work():
    """Both step FLOP counts equal the hand count: L layers of 4 gates from input and state, the tied output layer,
    backward twice forward; so their tok/s compare the same work."""
    s = dataclasses.replace(workloads.QUICK.lm, layers=2)
    b, t, d, v = s.batch, s.segment, s.d_model, s.vocab
    hand = 3 * (s.layers * 2 * b * t * 4 * d * 2 * d + 2 * b * t * d * v)
    for tk in LSTM_TOOLKITS.values():
        torch.manual_seed(0)
        case = speed.lm_train_case(tk.lm["lstm"], s)
        assert speed.count_step_flops(case.model, functools.partial(case.loss, 0, "float32")) == hand


# --- planning, skip notes, tables ------------------------------------------------------------------
def test_cli_choices_follow_the_measurement_code():
    assert set(bench_cli.WORKLOAD_CHOICES) == {*catalog.WORKLOADS, *catalog.GROUPS}
    assert set(bench_cli.PEER_CHOICES) == set(catalog.PEERS)
    assert bench.expand_workloads(["lm", "mt-train"]) == ["mt-train", *catalog.GROUPS["lm"]]


def fake_subprocess(toolkit: str, workloads: list[str], **kw) -> list[dict]:
    if toolkit == "machine":
        return [{"toolkit": "machine", "workload": "matmul-peak", "gflop_s": 100.0, "n": 64, "dtype": "float32",
                 "gflop_s_by_n": {"32": 50.0, "64": 100.0},
                 "torch": torch.__version__, "threads": 1}]
    return [{"toolkit": toolkit, "workload": w, "tok_s": 10.0 * (i + 1), "peak_rss_mb": 300.0, "params": 5,
             "flops_per_step": 10**9, "gflop_s": 25.0, "est_s": 2.0, "notes": f"{toolkit} model", "version": "1"}
            for i, w in enumerate(workloads)]


def test_missing_peers_become_skip_notes(monkeypatch, capsys):
    monkeypatch.setattr(bench, "installed", lambda name: False)
    monkeypatch.setattr(bench, "run_in_subprocess", fake_subprocess)
    workloads = ["mt-train", "lm-eval-xl", "lm-eval-vanilla"]
    rows = bench.annotate(bench.run_bench(workloads, ["huggingface", "xtransformers"], threads=1, quick=True))
    assert [(r["toolkit"], r["workload"]) for r in rows][:4] == [
        ("machine", "matmul-peak"), ("attnkit", "mt-train"), ("huggingface", "mt-train"), ("xtransformers", "mt-train")]
    skipped = [r for r in rows if "skipped" in r]
    assert len(skipped) == 2 * len(workloads) and all("not installed" in r["skipped"] for r in skipped)
    train = rows[1]
    assert train["vs_fastest"] == 1.0 and train["pct_matmul_peak"] == pytest.approx(25.0)
    xl = next(r for r in rows if r["workload"] == "lm-eval-xl" and r["toolkit"] == "attnkit")
    assert xl["xl_speedup"] == pytest.approx(20.0 / 30.0)  # the fake: eval-xl 20, eval-vanilla 30 tok/s
    err = capsys.readouterr().err
    assert err.count("bench [") == 1 + len(workloads)  # the matmul peak, then attnkit's measurements
    text = bench.render(rows, dtype="float32", threads=1, quick=True)
    assert "QUICK SMOKE RUN" in text and text.count("x-transformers is not installed") == len(workloads)
    assert "| train (B 4, 6→6) | attnkit | 10.0 | 1.00× |" in text


def test_rounds_take_turns_and_report_each_rows_median_round(monkeypatch):
    monkeypatch.setattr(bench, "installed", lambda name: True)
    calls: list[str] = []
    figures = {"attnkit": iter([30.0, 10.0, 20.0]), "xtransformers": iter([5.0, 7.0, 6.0])}

    def measure(toolkit: str, workloads: list[str], **kw) -> list[dict]:
        calls.append(toolkit)
        if toolkit == "machine":
            return fake_subprocess(toolkit, workloads)
        return [{"toolkit": toolkit, "workload": "mt-train", "tok_s": next(figures[toolkit]), "peak_rss_mb": 1.0}]

    monkeypatch.setattr(bench, "run_in_subprocess", measure)
    rows = bench.annotate(bench.run_bench(["mt-train"], ["xtransformers"], rounds=3))
    assert calls == ["machine", "attnkit", "xtransformers", "xtransformers", "attnkit", "attnkit", "xtransformers"]
    ak, xt = rows[1], rows[2]
    assert (ak["tok_s"], ak["rounds"]) == (20.0, [30.0, 10.0, 20.0])
    assert (xt["tok_s"], xt["rounds"]) == (6.0, [5.0, 7.0, 6.0])
    assert xt["vs_fastest"] == pytest.approx(0.3)
    text = bench.render(rows, dtype="float32", threads=2, quick=False)
    assert "median of 3 rounds: 30.0 / 10.0 / 20.0" in text


def test_json_file_is_not_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    out.write_text("keep\n")
    assert main(["bench", "--quick", "--json", out]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "keep\n"


def test_peers_script_is_a_bench_shortcut():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"
    spec = importlib.util.spec_from_file_location("peers_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.bench_argv(["--family", "mt", "--peers", "attnkit", "xtransformers", "--workloads", "greedy",
                              "beam5"]) == ["bench", "--workloads", "mt-greedy", "mt-beam5", "--peers", "xtransformers",
                                            "--dtype", "float32"]
    argv = module.bench_argv(["--family", "lm", "--dtype", "bfloat16"])
    assert argv[:6] == ["bench", "--workloads", "lm-train-xl", "lm-train-vanilla", "lm-eval-xl", "lm-eval-vanilla"]
    assert argv[-2:] == ["--dtype", "bfloat16"]
    assert all(w in catalog.WORKLOADS for w in module.bench_argv([])[2:9])  # every workload bench knows
    with pytest.raises(SystemExit):
        module.bench_argv(["--family", "lm", "--workloads", "greedy"])


# --- end to end ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_quick_bench_prints_every_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BENCH_CACHE", str(tmp_path / "cache"))  # the opus-mt-shape model is built there
    out = tmp_path / "bench.jsonl"
    assert main(["bench", "--quick", "--threads", "1", "--json", out]) == 0
    text, err = capsys.readouterr()
    assert text.startswith("**QUICK SMOKE RUN") and "### MT" in text and "### LM" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["workload"] == "matmul-peak" and rows[0]["gflop_s"] > 0
    planned = [(tk, w) for w in catalog.WORKLOADS for tk in catalog.TOOLKITS if w in catalog.TOOLKITS[tk].workloads]
    assert [(r["toolkit"], r["workload"]) for r in rows[1:]] == planned
    assert {tk for tk, w in planned if w == "mt-base-beam5"} == set(catalog.TOOLKITS) - {"pytorch"}  # all decode
    assert {tk for tk, w in planned if w == "lm-train-lstm"} == {"attnkit", "pytorch"}  # but the plain LSTM loop
    assert all(r["quick"] for r in rows)
    for r in rows[1:]:
        label = bench.workload_label(r["workload"], workloads.QUICK)
        assert f"| {label} | {LABEL[r['toolkit']]} |" in text  # every (workload, toolkit) has its row
        own = r["toolkit"] == "attnkit" or (r["toolkit"] == "attnkit-int8" and not int8_unavailable())
        if own and r["workload"] in catalog.OPUS_WORKLOADS and opus.unavailable("attnkit"):
            assert opus.unavailable("attnkit") in r["skipped"]  # no Marian importer or no transformers here
        elif own:
            assert r["tok_s"] > 0 and r["torch"] == torch.__version__ and r["threads"] == 1, r
        else:
            assert "tok_s" in r or "skipped" in r or "error" in r
    trains = [r for r in rows if r["workload"] in catalog.TRAIN_WORKLOADS and r["toolkit"] == "attnkit"]
    assert all(r["flops_per_step"] > 0 and r["pct_matmul_peak"] > 0 for r in trains)
    if catalog.installed("huggingface"):
        hf_xl = [r for r in rows if r["toolkit"] == "huggingface" and r["workload"].endswith("-xl")]
        assert all("no Transformer-XL" in r["skipped"] for r in hf_xl)
    measured = sum(1 for r in rows if "skipped" not in r)
    assert err.count("bench [") == measured
