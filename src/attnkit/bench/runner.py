"""`attnkit bench`: the standard workloads (../shared/bench/WORKLOADS.md) for attnkit and its installed peers.

The run plans one measurement per (workload, toolkit), starts each in a fresh interpreter
(`python -m attnkit.bench.measure`, see there for what is timed and how), plus one for the machine's
matrix-product peak when a training workload is asked for, and renders one markdown table per
workload family. Ratios compare toolkits within the same run, because the machines are noisy.

The quick mode runs tiny shapes (not the standard workloads) and, to stay fast, one process per
toolkit instead of one per measurement; it exists to smoke-test the whole path in tests and CI.

The mt-opus-* workloads decode one random Marian model that every toolkit reads in its own way (bench.opus
builds it once, before the measurements, in a process of its own); their rows carry the output ids, and each
row says in how many sentences its output equals Hugging Face transformers' token for token: attnkit float32's
greedy output must equal it (the check line under the table; when it does not, `attnkit bench` exits with 1 after
printing every table: `check_outputs`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

from attnkit.bench import measure, opus
from attnkit.bench.catalog import (
    GROUPS,
    OPUS_WORKLOADS,
    OWN,
    TOOLKIT_LABELS,
    TOOLKITS,
    TRAIN_WORKLOADS,
    WORKLOADS,
    installed,
)
from attnkit.bench.workloads import QUICK, STANDARD, Shapes, mt_shape
from attnkit.errors import AttnkitError

PRECISION = {"bfloat16": "training in bfloat16 (autocast), decoding and evaluation in float32"}


@dataclass(frozen=True)
class Cell:
    """One planned measurement; `skip` says why it will not run."""

    toolkit: str
    workload: str
    skip: str = ""


def expand_workloads(names: Iterable[str]) -> list[str]:
    """Workload names and groups (all, mt, lm) -> workload names in the standard order."""
    wanted = {w for name in names for w in GROUPS.get(name, [name])}
    unknown = wanted - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workloads: {', '.join(sorted(unknown))}")
    return [w for w in WORKLOADS if w in wanted]


def skip_reason(toolkit: str, workload: str) -> str:
    if toolkit != "attnkit" and not installed(toolkit):
        return f"skipped: {TOOLKITS[toolkit].pip} is not installed (pip install {TOOLKITS[toolkit].pip})"
    reason = measure.toolkit(toolkit).missing.get(workload, "")
    return f"not measured: {reason}" if reason else ""


def plan(workloads: list[str], peers: list[str]) -> list[Cell]:
    """attnkit (float32, and int8 where it decodes) and every peer on each workload it is made for, workload by
    workload (neighbours share the machine's mood)."""
    return [Cell(tk, w, skip_reason(tk, w)) for w in workloads for tk in [*OWN, *peers] if w in TOOLKITS[tk].workloads]


# --- running ---------------------------------------------------------------------------------------
def run_in_subprocess(toolkit: str, workloads: list[str], *, dtype: str = "float32", threads: int = 2,
                      quick: bool = False) -> list[dict]:
    """Measure in a fresh interpreter; one result per workload (an `error` row when the process died)."""
    cmd = [sys.executable, "-m", "attnkit.bench.measure", "--toolkit", toolkit, "--workload", *workloads,
           "--threads", str(threads), "--dtype", dtype, *(["--quick"] if quick else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    done = {r["workload"] for r in results}
    last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1][:300]
    results += [{"toolkit": toolkit, "workload": w, "quick": quick, "error": f"process failed: {last}"}
                for w in workloads if w not in done]
    return results


def jobs_for(cells: list[Cell], quick: bool, rounds: int = 1) -> list[tuple[str, list[str]]]:
    """(toolkit, workloads) per process: the matmul peak when training is measured, then one per measurement,
    `rounds` times, each round starting a workload with the next toolkit (quick: one process per toolkit, a
    smoke test, not a measurement)."""
    runnable = [c for c in cells if not c.skip]
    jobs = [("machine", ["matmul-peak"])] if any(c.workload in TRAIN_WORKLOADS for c in cells) else []
    if quick:
        toolkits = dict.fromkeys(c.toolkit for c in runnable)
        return jobs + [(tk, [c.workload for c in runnable if c.toolkit == tk]) for tk in toolkits]
    for r in range(rounds):
        for workload in dict.fromkeys(c.workload for c in runnable):
            order = [c.toolkit for c in runnable if c.workload == workload]
            shift = r % len(order)
            jobs += [(tk, [workload]) for tk in order[shift:] + order[:shift]]
    return jobs


def progress_line(i: int, n: int, row: dict, seconds: float) -> str:
    """`bench [i/n] workload · toolkit: figure (seconds of its process)`."""
    what = f"bench [{i}/{n}] {row['workload']} · {TOOLKIT_LABELS.get(row['toolkit'], row['toolkit'])}: "
    if row["workload"] == "matmul-peak" and "gflop_s" in row:
        return what + f"{row['gflop_s']:,.1f} GFLOP/s at {row['n']}³ ({seconds:.1f} s)"
    if "tok_s" in row:
        return what + f"{row['tok_s']:,.1f} tok/s, peak RSS {row['peak_rss_mb']:,.0f} MB ({seconds:.1f} s)"
    return what + (row.get("skipped") or row.get("error", "no result"))


def prepare_opus(cells: list[Cell], shapes: Shapes, log: TextIO) -> None:
    """Build what the planned mt-opus-* measurements read (bench.opus) before they run, so that no measuring
    process spends its time building; a failure is logged, and each of those measurements reports it."""
    parts = list(dict.fromkeys(opus.TOOLKIT_PART[c.toolkit] for c in cells
                               if c.workload in OPUS_WORKLOADS and not c.skip))
    if not parts:
        return
    start = time.perf_counter()
    try:
        opus.ensure(shapes.mt_opus, parts)
        done = f"in {opus.model_root(shapes.mt_opus)}"
    except RuntimeError as e:
        done = str(e)
    print(f"bench: the opus-mt-shape model ({', '.join(parts)}) {done} ({time.perf_counter() - start:.1f} s)",
          file=log, flush=True)


def median_row(rows: list[dict]) -> dict:
    """The round with the median tok/s (the lower middle one for an even count), with every round's figure
    in `rounds`; an error row only when no round measured."""
    ok = sorted((r for r in rows if "tok_s" in r), key=lambda r: r["tok_s"])
    if not ok:
        return rows[-1]
    if len(rows) == 1:
        return ok[0]
    return {**ok[(len(ok) - 1) // 2], "rounds": [r.get("tok_s") for r in rows]}


def run_bench(workloads: list[str], peers: list[str], *, dtype: str = "float32", threads: int = 2,
              quick: bool = False, rounds: int = 1, log: TextIO | None = None) -> list[dict]:
    """Every planned row in plan order (the matmul peak first, when measured); skipped cells become rows
    with a `skipped` note; with several rounds, each row is its median round. A progress line per
    measurement goes to `log` (default: stderr)."""
    log = log or sys.stderr
    cells, measured = plan(workloads, peers), {}
    prepare_opus(cells, QUICK if quick else STANDARD, log)
    jobs = jobs_for(cells, quick, rounds)
    total, done = sum(len(names) for _, names in jobs), 0
    for toolkit, names in jobs:
        start = time.perf_counter()
        for row in run_in_subprocess(toolkit, names, dtype=dtype, threads=threads, quick=quick):
            measured.setdefault((row["toolkit"], row["workload"]), []).append(row)
            done += 1
            print(progress_line(done, total, row, time.perf_counter() - start), file=log, flush=True)
    peak = [measured[key][0] for key in [("machine", "matmul-peak")] if key in measured]
    return peak + [median_row(measured[c.toolkit, c.workload]) if (c.toolkit, c.workload) in measured else
                   {"toolkit": c.toolkit, "workload": c.workload, "skipped": c.skip, "quick": quick} for c in cells]


# --- derived figures -------------------------------------------------------------------------------
def agreement(ids: list[list[int]], reference: list[list[int]]) -> dict:
    """How many sentences of `ids` equal the reference's token for token, and where the first difference is."""
    same = sum(a == b for a, b in zip(ids, reference))
    out = {"sentences_equal": same, "sentences": len(reference), "identical": ids == reference}
    for i, (a, b) in enumerate(zip(ids, reference)):
        if a != b:
            j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first = {"sentence": i, "token": j, "ids": a[j : j + 1], "reference": b[j : j + 1]}
            return out | {"first_difference": first}
    return out


def compare_outputs(rows: list[dict]) -> None:
    """Each measured mt-opus-* row gets `same_as_hf`: its output ids against Hugging Face transformers' on the same
    workload (every toolkit decodes the same Marian model from the same ids); the ids are then replaced by a
    sha256 of them."""
    hf = {r["workload"]: r["output_ids"] for r in rows if r["toolkit"] == "huggingface" and "output_ids" in r}
    for r in rows:
        if "output_ids" not in r:
            continue
        if r["workload"] in hf and r["toolkit"] != "huggingface":
            r["same_as_hf"] = agreement(r["output_ids"], hf[r["workload"]])
        r["output_sha256"] = hashlib.sha256(json.dumps(r.pop("output_ids")).encode()).hexdigest()


def greedy_check(rows: list[dict]) -> dict | None:
    """attnkit float32's greedy output on the opus-mt-shape model against transformers' (None: not both measured)."""
    row = next((r for r in rows if r["toolkit"] == "attnkit" and r["workload"] == "mt-opus-greedy"), None)
    return row.get("same_as_hf") if row else None


class CheckFailed(AttnkitError):
    """A correctness check of the run failed: the command exits with 1 (2 is a usage error) after the tables."""

    exit_code = 1


def check_outputs(rows: list[dict]) -> None:
    """CheckFailed when the greedy check failed: attnkit float32's output on mt-opus-greedy is not transformers'.
    A speed measured on wrong outputs is no result, so a script or CI job running the bench must see it fail."""
    check = greedy_check(rows)
    if check is not None and not check["identical"]:
        raise CheckFailed(f"the greedy check FAILED: attnkit float32's output equals HF transformers' in "
                          f"{check['sentences_equal']} of {check['sentences']} sentences of mt-opus-greedy (the "
                          "first difference is under the opus-mt table)")


def annotate(rows: list[dict]) -> list[dict]:
    """Add vs_fastest (per workload), pct_matmul_peak (training rows), xl_speedup (lm-eval-xl rows) and, on the
    opus-mt-shape workloads, each output's agreement with transformers' (compare_outputs)."""
    compare_outputs(rows)
    peak = next((r.get("gflop_s") for r in rows if r["workload"] == "matmul-peak"), None)
    best: dict[str, float] = {}
    for r in rows:
        if "tok_s" in r:
            best[r["workload"]] = max(best.get(r["workload"], 0.0), r["tok_s"])
    vanilla = {r["toolkit"]: r["tok_s"] for r in rows if r["workload"] == "lm-eval-vanilla" and "tok_s" in r}
    for r in rows:
        if "tok_s" not in r:
            continue
        r["vs_fastest"] = r["tok_s"] / best[r["workload"]]
        if r["workload"] in TRAIN_WORKLOADS and peak and "gflop_s" in r:
            r["pct_matmul_peak"] = 100 * r["gflop_s"] / peak
        if r["workload"] == "lm-eval-xl" and r["toolkit"] in vanilla:
            r["xl_speedup"] = r["tok_s"] / vanilla[r["toolkit"]]
    return rows


# --- tables ----------------------------------------------------------------------------------------
def fmt(x: float | None, digits: int = 0) -> str:
    """Thousands separators; one decimal below 100, two significant digits below 1."""
    if x is None:
        return "—"
    if abs(x) < 1:
        return f"{x:.2g}"
    return f"{x:,.{digits if abs(x) >= 100 else max(digits, 1)}f}"


def workload_label(workload: str, shapes: Shapes) -> str:
    mt, lm = mt_shape(workload, shapes), shapes.lm
    return {
        "mt-train": f"train (B {mt.train_batch}, {mt.src_len}→{mt.tgt_len})",
        "mt-greedy": f"greedy ({mt.greedy_batch} src, {mt.tgt_len} new)",
        "mt-beam5": f"beam {mt.beam} ({mt.beam_batch} src, {mt.tgt_len} new)",
        "mt-base-greedy": f"base greedy ({mt.greedy_batch} src, {mt.tgt_len} new)",
        "mt-base-beam5": f"base beam {mt.beam} ({mt.beam_batch} src, {mt.tgt_len} new)",
        "mt-opus-greedy": f"opus-mt greedy ({mt.greedy_batch} src, {mt.tgt_len} new)",
        "mt-opus-beam5": f"opus-mt beam {mt.beam} ({mt.beam_batch} src, {mt.tgt_len} new)",
        "lm-train-xl": f"train XL (B {lm.batch} × {lm.segment}, memory {lm.memory})",
        "lm-train-vanilla": f"train vanilla (B {lm.batch} × {lm.segment})",
        "lm-train-lstm": f"train LSTM (B {lm.batch} × {lm.segment}, state carried)",
        "lm-eval-xl": f"eval XL (segment {lm.segment} + memory {lm.memory})",
        "lm-eval-vanilla": f"eval vanilla (sliding window {lm.context}, {lm.windows} timed)",
    }[workload]


def rss_cell(r: dict) -> str:
    if "peak_rss_mb" not in r or "tok_s" not in r:
        return "—"
    after = f" ({r['rss_after_build_mb']:,.0f} after build)" if "rss_after_build_mb" in r else ""
    return f"{r['peak_rss_mb']:,.0f}{after}"


def status(r: dict) -> str:
    same = r.get("same_as_hf")
    same = f"output = HF's in {same['sentences_equal']}/{same['sentences']} sentences" if same else ""
    if "rounds" in r:
        rounds = f"median of {len(r['rounds'])} rounds: " + " / ".join(fmt(x) for x in r["rounds"])
        return "; ".join(x for x in (rounds, same) if x)
    return same or (r.get("skipped") or r.get("error", "")).replace("|", "/")[:160]


def row_cells(r: dict, shapes: Shapes, lm: bool) -> list[str]:
    ok = "tok_s" in r
    cells = [workload_label(r["workload"], shapes), TOOLKIT_LABELS.get(r["toolkit"], r["toolkit"]),
             fmt(r.get("tok_s")), f"{r['vs_fastest']:.2f}×" if ok else "—"]
    if lm:
        cells += [fmt(r.get("est_s"), 1), f"{fmt(r['xl_speedup'])}×" if "xl_speedup" in r else "—"]
    cells += [rss_cell(r), fmt(r.get("gflop_s"), 1) if r["workload"] in TRAIN_WORKLOADS and ok else "—",
              f"{fmt(r['pct_matmul_peak'])}%" if "pct_matmul_peak" in r else "—",
              f"{r['params']:,}" if "params" in r else "—", status(r)]
    return cells


def family_table(rows: list[dict], family: str, shapes: Shapes) -> str:
    lm = family == "lm"
    head = ["workload", "toolkit", "tok/s", "vs fastest"]
    head += [f"est. s for {shapes.lm.eval_tokens:,} tokens", "XL / vanilla eval"] if lm else []
    head += ["peak RSS MB", "GFLOP/s", "% of matmul peak", "params", "note"]
    align = ["---", "---", "---:", "---:"] + (["---:", "---:"] if lm else []) + ["---:", "---:", "---:", "---:", "---"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row_cells(r, shapes, lm)) + " |" for r in rows]
    return "\n".join(lines)


def family_title(family: str, shapes: Shapes) -> str:
    if family == "mt-opus":
        s = shapes.mt_opus
        return (f"### MT at the opus-mt shape: one random MarianMTModel (d {s.d_model}, {s.heads} heads, FFN {s.ffn}, "
                f"{s.layers}+{s.layers} layers, swish, output bias, one table of {s.vocab:,} tokens), read by every "
                f"toolkit")
    if family.startswith("mt"):
        s, name = (shapes.mt_base, "MT at the Transformer-base shape") if family == "mt-base" else (shapes.mt, "MT")
        return (f"### {name}: encoder-decoder Transformer (d {s.d_model}, {s.heads} heads, FFN {s.ffn}, "
                f"{s.layers}+{s.layers} layers, vocab {s.vocab}, dropout {s.dropout})")
    s = shapes.lm
    layers = f"{s.layers} layer{'s' if s.layers != 1 else ''}"
    return (f"### LM: character-level decoder-only (d {s.d_model}, {s.heads} heads, FFN {s.ffn}, {layers}, "
            f"vocab {s.vocab}, dropout {s.dropout}; XL segment {s.segment} + memory {s.memory}, vanilla window "
            f"{s.context}; evaluation over {s.eval_tokens:,} tokens, batch 1)")


def header(rows: list[dict], dtype: str, threads: int, quick: bool) -> list[str]:
    meta = next((r for r in rows if "torch" in r), {})
    versions = dict.fromkeys(f"{TOOLKIT_LABELS[r['toolkit']]} {r['version']}".strip() for r in rows
                             if r.get("version") and r["toolkit"] != "machine")
    peak = next((r for r in rows if r["workload"] == "matmul-peak"), None)
    peak_text = "matmul peak: not measured"
    if peak and "gflop_s" in peak:
        sizes = "/".join(f"{n}³" for n in peak["gflop_s_by_n"])
        peak_text = (f"matmul peak ({peak['dtype']}, best of {sizes}, own process): {peak['gflop_s']:,.1f} GFLOP/s "
                     f"at {peak['n']}³")
    lines = []
    if quick:
        lines += ["**QUICK SMOKE RUN — tiny shapes, NOT the standard workloads of WORKLOADS.md, one process per "
                  "toolkit: these figures compare nothing; they only show that every path runs.**", ""]
    lines += [f"## attnkit bench{' --quick' if quick else ''}: "
              f"{'smoke shapes' if quick else 'the standard workloads of WORKLOADS.md'}",
              "",
              f"torch {meta.get('torch', '?')} · {threads} thread{'s' if threads != 1 else ''} · "
              f"{PRECISION.get(dtype, dtype)} · {peak_text} · "
              f"{', '.join(versions)} · {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"]
    return lines


def model_notes(rows: list[dict]) -> list[str]:
    """One line per (toolkit, model) measured: what it is and which defaults it keeps."""
    def model(workload: str) -> str:
        return "" if workload.startswith("mt-") else f" ({workload.rsplit('-', 1)[1]})"

    return list(dict.fromkeys(f"- {TOOLKIT_LABELS.get(r['toolkit'], r['toolkit'])}{model(r['workload'])}: "
                              f"{r['notes']}" for r in rows if r.get("notes")))


FOOTNOTES = [
    "- tok/s: MT train = target tokens/s, decoding = generated tokens/s (encoder included); LM train = tokens/s; "
    "LM eval = scored tokens/s (vanilla: windows timed, 1 / per-window time, extrapolated to the whole stream).",
    "- vs fastest: ratio to the fastest toolkit on the same workload in this run (the machine is noisy); with "
    "--rounds N every measurement ran N times, the toolkits taking turns, and each row is its median round.",
    "- peak RSS: ru_maxrss of the measurement's own process (interpreter and libraries included).",
    "- GFLOP/s: FLOPs of one training step counted by torch.utils.flop_counter.FlopCounterMode over forward + loss + "
    "backward (matrix products and attention, full score matrices even where causal; the Adam update is not "
    "counted), divided by the median step time; % of matmul peak: against the fastest square matrix product above.",
]


# The speed goals of the opus-mt-shape workloads: (numerator, denominator, goal) per ratio.
OPUS_GOALS = (("attnkit-int8", "ctranslate2-int8", 1.2), ("attnkit", "huggingface", 1.5))


def opus_lines(rows: list[dict], shapes: Shapes) -> list[str]:
    """Under the opus-mt table: the data rule, the goals' ratios measured in this run, and the greedy check."""
    s = shapes.mt_opus
    tok = {(r["toolkit"], r["workload"]): r["tok_s"] for r in rows if "tok_s" in r}
    lines = [f"- sources: {s.src_len - 1} random source pieces of vocab.json and </s> per sentence, the same for "
             f"every toolkit (attnkit maps them to its own ids by piece, CTranslate2 reads the pieces); exactly "
             f"{s.tgt_len} new tokens each (EOS blocked until then), as in MT (b) and (c)"]
    for workload in OPUS_WORKLOADS:
        ratios = [f"{TOOLKIT_LABELS[a]} ÷ {TOOLKIT_LABELS[b]} {tok[a, workload] / tok[b, workload]:.2f}× "
                  f"(goal ≥ {goal}×)" for a, b, goal in OPUS_GOALS if (a, workload) in tok and (b, workload) in tok]
        if ratios:
            lines.append(f"- {workload}: " + "; ".join(ratios))
    check = greedy_check(rows)
    if check is None:
        lines.append("- greedy check: not made (attnkit and HF transformers were not both measured on mt-opus-greedy)")
    elif check["identical"]:
        lines.append(f"- greedy check: attnkit float32's output equals HF transformers' token for token in all "
                     f"{check['sentences']} sentences")
    else:
        d = check["first_difference"]
        lines.append(f"- greedy check FAILED: attnkit float32's output equals HF transformers' in "
                     f"{check['sentences_equal']} of {check['sentences']} sentences; first difference: sentence "
                     f"{d['sentence']}, token {d['token']} (attnkit {d['ids']}, HF {d['reference']})")
    return ["", "The opus-mt shape, this run:", *lines]


def render(rows: list[dict], *, dtype: str, threads: int, quick: bool) -> str:
    shapes = QUICK if quick else STANDARD
    lines = header(rows, dtype, threads, quick)
    for family in ("mt", "mt-base", "mt-opus", "lm"):
        members = [r for r in rows if WORKLOADS.get(r["workload"], ("",))[0] == family]
        if members:
            lines += ["", family_title(family, shapes) + (" — quick smoke shapes" if quick else ""), "",
                      family_table(members, family, shapes), "", "Models (each keeps its defaults where the "
                      "workload is silent):", *model_notes(members)]
            lines += opus_lines(members, shapes) if family == "mt-opus" else []
    return "\n".join([*lines, "", *FOOTNOTES])
