"""Workload MT of ../shared/bench/WORKLOADS.md through attnkit and its peers, side by side in one run.

    python benchmarks/mt_peers.py                                   # every peer that imports, every workload
    python benchmarks/mt_peers.py --peers attnkit xtransformers --workloads greedy beam5

Peers: attnkit, Hugging Face transformers (BART layout at the workload's shape) and x-transformers
(`pip install transformers x-transformers`). Each (peer, workload) runs in a fresh interpreter with 2
threads (`--one PEER WORKLOAD` prints one JSON line), so peak RSS is that measurement's own. The table
gives each figure as a ratio to the fastest peer measured in the same run: the machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable

import torch

from attnkit.eval.speed import MT_LEN, MT_VOCAB, mt_batch, mt_decode, mt_train, peak_rss_mb, timed

BOS, EOS, PAD = 1, 2, 0
WORKLOADS = ("train", "greedy", "beam5")


# --- Hugging Face transformers ------------------------------------------------------------------
def hf_model():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    cfg = BartConfig(vocab_size=MT_VOCAB, d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, dropout=0.1,
                     attention_dropout=0.1, activation_dropout=0.1, max_position_embeddings=256, pad_token_id=PAD,
                     bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS, forced_bos_token_id=None,
                     forced_eos_token_id=None, scale_embedding=True, tie_word_embeddings=True)
    return BartForConditionalGeneration(cfg)


def hf_logits(model, src, tgt_in):
    return model(input_ids=src, decoder_input_ids=tgt_in).logits


def hf_generate(model, src, beams: int):
    out = model.generate(input_ids=src, max_new_tokens=MT_LEN, min_new_tokens=MT_LEN, num_beams=beams,
                         do_sample=False, length_penalty=1.0, early_stopping=False)
    return out[:, 1:]  # drop the decoder start token


# --- x-transformers -----------------------------------------------------------------------------
def xt_model():
    from x_transformers import XTransformer

    torch.manual_seed(0)
    side = dict(num_tokens=MT_VOCAB, depth=3, heads=4, max_seq_len=256, attn_dropout=0.1, ff_dropout=0.1,
                emb_dropout=0.1)
    kw = {f"enc_{k}": v for k, v in side.items()} | {f"dec_{k}": v for k, v in side.items()}
    return XTransformer(dim=256, tie_token_emb=True, pad_value=PAD, **kw)


def xt_logits(model, src, tgt_in):
    enc = model.encoder(src, return_embeddings=True)  # (B, S, D)
    return model.decoder.net(tgt_in, context=enc)  # (B, T, V)


def xt_generate(model, src, beams: int):
    start = torch.full((src.size(0), 1), BOS, dtype=torch.long)
    if beams == 1:
        return model.generate(src, start, MT_LEN, temperature=0.0)
    # x-transformers 2.31's beam search keeps the encoder context at batch B while its rows grow to
    # B*beams, so it fails on an encoder-decoder; the table then shows its error message.
    enc = model.encoder(src, return_embeddings=True)
    return model.decoder.beam_search(start, MT_LEN, beams=beams, context=enc)


PEERS: dict[str, tuple[Callable, Callable, Callable, str]] = {
    "huggingface": (hf_model, hf_logits, hf_generate, "transformers.BartForConditionalGeneration, post-LN, "
                    "GELU, learned positions"),
    "xtransformers": (xt_model, xt_logits, xt_generate, "x_transformers.XTransformer, pre-LN, GELU, "
                      "learned positions, untied output"),
}


def peer_train(peer: str) -> dict:
    build, logits_of, _, _ = PEERS[peer]
    model = build().train()
    rss_build = peak_rss_mb()
    src, tgt_in, tgt = mt_batch(64)
    opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)

    def step() -> None:
        opt.zero_grad()
        logits = logits_of(model, src, tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                                                 label_smoothing=0.1)
        loss.backward()
        opt.step()

    sec = timed(step, 5, 20)
    return {"tok_s": 64 * MT_LEN / sec, "rss_after_build_mb": rss_build}


def peer_decode(peer: str, beams: int) -> dict:
    build, _, generate, _ = PEERS[peer]
    model = build().eval()
    n = 64 if beams == 1 else 16
    src, _, _ = mt_batch(n)

    def run() -> None:
        with torch.no_grad():
            out = generate(model, src, beams)
        assert out.shape == (n, MT_LEN), f"{peer} generated {tuple(out.shape)}, not {(n, MT_LEN)}"

    return {"tok_s": n * MT_LEN / timed(run, 1, 3)}


def measure(peer: str, workload: str) -> dict:
    if peer == "attnkit":
        result = {"train": mt_train, "greedy": lambda: mt_decode(1), "beam5": lambda: mt_decode(5)}[workload]()
        notes = "attnkit.Transformer, post-LN, ReLU, sinusoidal positions, tied"
    else:
        result = peer_train(peer) if workload == "train" else peer_decode(peer, 1 if workload == "greedy" else 5)
        notes = PEERS[peer][3]
    return result | {"peer": peer, "workload": workload, "peak_rss_mb": peak_rss_mb(), "notes": notes,
                     "torch": torch.__version__, "threads": torch.get_num_threads()}


def run_one(peer: str, workload: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--one", peer, workload], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {"peer": peer, "workload": workload, "error": last[:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: list[dict], peers: list[str], workloads: list[str]) -> str:
    cell = {(r["peer"], r["workload"]): r for r in results}
    best = {w: max((r.get("tok_s", 0) for r in results if r["workload"] == w), default=0) for w in workloads}
    head = "| peer | " + " | ".join(f"{w} tok/s | vs best" for w in workloads) + " | peak RSS MB |"
    lines = [head, "|---|" + "---:|---:|" * len(workloads) + "---|"]
    for p in peers:
        row, rss = [], []
        for w in workloads:
            r = cell.get((p, w), {})
            if "tok_s" in r:
                row += [f"{r['tok_s']:,.0f}", f"{r['tok_s'] / best[w]:.2f}×"]
                rss.append(f"{r['peak_rss_mb']:,.0f}")
            else:
                row += [r.get("error", "—")[:60], "—"]
                rss.append("—")
        lines.append(f"| {p} | " + " | ".join(row) + f" | {' / '.join(rss)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", nargs="+", default=["attnkit", *PEERS])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--json", help="also write the results as JSON lines here")
    ap.add_argument("--one", nargs=2, metavar=("PEER", "WORKLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        torch.set_num_threads(2)
        torch.manual_seed(0)
        print(json.dumps(measure(*args.one)))
        return
    results = []
    for w in args.workloads:
        for p in args.peers:
            results.append(run_one(p, w))
            print(json.dumps(results[-1]), file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    print(table(results, args.peers, args.workloads))


if __name__ == "__main__":
    main()
