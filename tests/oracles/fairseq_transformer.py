"""The oracle of tests/test_import_fairseq.py: fairseq's own Transformer (fairseq-fixed 0.12.3.1, run from its source
in the environment `make oracles` builds, build/oracles/fairseq), never imported by attnkit.

    python fairseq_transformer.py CASE.json OUT_DIR

CASE.json: {"args": fairseq-train's options after the data folder (--arch and its sizes), "seed": int,
"symbols": dict.txt's symbols in order, "pairs": [[source ids, target ids], ...] in fairseq's ids without EOS,
"max_len_b": int}. Writes into OUT_DIR dict.src.txt and dict.tgt.txt (those symbols), checkpoint_best.pt as
fairseq's trainer saves one (Trainer.state_dict: cfg as a container, cfg.model an argparse.Namespace for a legacy
--arch, the model's state dict, the extra state), and outputs.json: for each pair, the target's log-probabilities
token by token (teacher-forced in one left-padded batch, EOS last) and the greedy search's tokens (fairseq's
SequenceGenerator, beam 1, max_len_a 0).
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import torch
from fairseq import options, tasks
from fairseq.data import data_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.sequence_generator import SequenceGenerator
from omegaconf import OmegaConf


def build(case: dict, out: Path):
    for side in ("src", "tgt"):
        (out / f"dict.{side}.txt").write_text("".join(f"{s} {1000 - i}\n" for i, s in enumerate(case["symbols"])),
                                               encoding="utf-8")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(out), "--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--cpu", *case["args"]])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(case["seed"])
    model = task.build_model(cfg.model).eval()
    with torch.no_grad():  # no parameter at its tidy initial value (zero biases, unit gains) hides a mapping error
        for name, p in model.named_parameters():
            p.normal_(1.0 if "layer_norm" in name and name.endswith("weight") else 0.0, 0.3)
    assert isinstance(cfg.model, Namespace)  # as fairseq-train's legacy --arch transformer* leaves it
    torch.save({"args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                "model": model.state_dict(), "criterion": None, "optimizer_history": [],
                "task_state": {}, "extra_state": {"previous_training_time": 0.0}}, out / "checkpoint_best.pt")
    return task, model


def outputs(case: dict, task, model) -> list[dict]:
    d = task.target_dictionary
    eos, pad = d.eos(), d.pad()
    sources = [torch.tensor(s + [eos]) for s, _ in case["pairs"]]
    targets = [torch.tensor(t + [eos]) for _, t in case["pairs"]]
    src = data_utils.collate_tokens(sources, pad, eos, left_pad=True)  # fairseq's batches left-pad the source
    prev = data_utils.collate_tokens(targets, pad, eos, left_pad=False, move_eos_to_beginning=True)
    lengths = torch.tensor([len(s) for s in sources])
    with torch.no_grad():
        out = model(src, lengths, prev)
        logp = model.get_normalized_probs(out, log_probs=True)  # (B, T, V)
    gen = SequenceGenerator([model], d, beam_size=1, max_len_a=0, max_len_b=case["max_len_b"])
    rows = []
    for i, target in enumerate(targets):
        hypo = gen.generate([model], {"net_input": {"src_tokens": sources[i][None],
                                                    "src_lengths": torch.tensor([len(sources[i])])}})[0][0]
        rows.append({"target_logprobs": logp[i, torch.arange(len(target)), target].tolist(),
                     "greedy": hypo["tokens"].tolist()})
    return rows


def main(case_path: str, out_dir: str) -> None:
    case = json.loads(Path(case_path).read_text(encoding="utf-8"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task, model = build(case, out)
    (out / "outputs.json").write_text(json.dumps(outputs(case, task, model)), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
