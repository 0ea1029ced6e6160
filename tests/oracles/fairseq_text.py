"""The oracle of tests/test_moses_bpe.py: fairseq's own text pipeline (fairseq-fixed 0.12.3.1 in the environment
`make oracles` builds, build/oracles/fairseq): its `moses` tokenizer and `subword_nmt` BPE, built by its registries
from settings as fairseq's hub builds them, and its Dictionary. Never imported by attnkit.

    python fairseq_text.py CASE.json OUT.json

CASE.json: {"codes": BPE codes file, "dict": dict.txt, "source_lang", "target_lang", "encode": [text, ...],
"decode": [[fairseq id, ...], ...]}. OUT.json: {"encoded": fairseq's ids of every text (no EOS), "decoded": the text
of every id list (the hub's decode: Dictionary.string, BPE removed, Moses detokenized)}.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import torch
from fairseq.data import Dictionary, encoders


def main(case_path: str, out_path: str) -> None:
    case = json.loads(Path(case_path).read_text(encoding="utf-8"))
    tokenizer = encoders.build_tokenizer(Namespace(tokenizer="moses", source_lang=case["source_lang"],
                                                   target_lang=case["target_lang"], moses_no_dash_splits=False,
                                                   moses_no_escape=False))
    bpe = encoders.build_bpe(Namespace(bpe="subword_nmt", bpe_codes=case["codes"], bpe_separator="@@"))
    d = Dictionary.load(case["dict"])
    encoded = [d.encode_line(bpe.encode(tokenizer.encode(text)), add_if_not_exist=False, append_eos=False).tolist()
               for text in case["encode"]]
    decoded = [tokenizer.decode(bpe.decode(d.string(torch.tensor(ids)))) for ids in case["decode"]]
    Path(out_path).write_text(json.dumps({"encoded": encoded, "decoded": decoded}, ensure_ascii=False),
                              encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
