"""Adaptive input embeddings and the adaptive softmax (issue 3) against word-by-word references: a distribution at
every position, the training NLL = -log p gathered from it (values and gradients), cutoffs [] = the plain softmax
exactly, per-cluster rows and projections, tying, config checks, and a tiny adaptive Transformer-XL through the
trainer, its checkpoint and `attnkit lm eval | generate`."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import config as cfgmod
from attnkit.checkpoint import load_lm_checkpoint
from attnkit.cli.main import main
from attnkit.config import TransformerXLConfig
from attnkit.cpu.rows import ADAPTIVE_ROWS
from attnkit.decode.lm import ContextRule, generate
from attnkit.errors import ConfigError
from attnkit.eval.lm import evaluate_segments, evaluate_sliding_window
from attnkit.models import build_model
from attnkit.nn.adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax, bucketed
from attnkit.train.lm_trainer import LMTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

V, D = 23, 16
CUTOFFS = [5, 12]  # clusters: ids 0-4 (head), 5-11, 12-22


def layers(cutoffs=CUTOFFS, div_val: int = 2) -> tuple[AdaptiveEmbedding, AdaptiveLogSoftmax]:
    torch.manual_seed(0)
    embed = AdaptiveEmbedding(V, D, cutoffs, div_val).double()
    softmax = AdaptiveLogSoftmax(V, D, cutoffs).double()
    with torch.no_grad():  # non-zero biases and cluster logits (they start at 0), so a misplaced one shows
        for p in softmax.parameters():
            p.normal_()
    return embed, softmax


def tiny(kind: str = "transformer-xl", **kw):
    base = dict(kind=kind, vocab_size=V, d_model=D, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, cutoffs=CUTOFFS,
                div_val=2)
    torch.manual_seed(0)
    model = build_model(kind, TransformerXLConfig(**{**base, **kw})).double().eval()
    with torch.no_grad():
        for p in model.softmax.parameters():
            p.normal_()
    return model


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))


def every_cluster(n: int = 2) -> torch.Tensor:
    """(n, V) targets: every word of every cluster, in a different order per row."""
    return torch.stack([torch.randperm(V, generator=torch.Generator().manual_seed(s)) for s in range(n)])


def reference_log_prob(h: torch.Tensor, embed: AdaptiveEmbedding, softmax: AdaptiveLogSoftmax,
                       cutoffs: list[int]) -> torch.Tensor:
    """h (N, D) -> (N, V) word by word: a word's output vector is its input embedding (before scaling), proj row."""
    bounds = [0, *cutoffs, V]

    def vector(w: int) -> torch.Tensor:  # (D,)
        i = next(c for c in range(len(bounds) - 1) if w < bounds[c + 1])
        if i == 0:
            return embed.weight[w]
        row = embed.tables[i - 1][w - bounds[i]]
        return embed.projs[i - 1] @ row if len(embed.projs) else row

    head = [h @ vector(w) + softmax.bias[w] for w in range(bounds[1])]
    if cutoffs:
        head += [h @ softmax.cluster_head.weight[i] + softmax.cluster_head.bias[i] for i in range(len(cutoffs))]
    head_lp = torch.stack(head, -1).log_softmax(-1)  # (N, V_0 + n)
    out = [head_lp[:, : bounds[1]]]
    for i in range(1, len(bounds) - 1):
        words = range(bounds[i], bounds[i + 1])
        scores = torch.stack([h @ vector(w) + softmax.bias[w] for w in words], -1)  # (N, V_i)
        out.append(head_lp[:, bounds[1] + i - 1, None] + scores.log_softmax(-1))
    return torch.cat(out, -1)


# --- the adaptive softmax -------------------------------------------------------------------------
@pytest.mark.parametrize("cutoffs, div_val", [(CUTOFFS, 2), (CUTOFFS, 1), ([7], 4), ([], 1)])
def test_log_prob_is_a_distribution_and_matches_the_word_by_word_reference(cutoffs, div_val):
    embed, softmax = layers(cutoffs, div_val)
    h = torch.randn(3, 4, D, dtype=torch.float64)
    log_prob = softmax.log_prob(h, embed)  # (3, 4, V)
    assert log_prob.shape == (3, 4, V)
    torch.testing.assert_close(log_prob.logsumexp(-1), torch.zeros(3, 4, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(log_prob.view(12, V), reference_log_prob(h.view(12, D), embed, softmax, cutoffs))
    logits = softmax.logits(h, embed)  # what the models return as "logits": the same distribution
    torch.testing.assert_close(logits.log_softmax(-1), log_prob)


@pytest.mark.parametrize("cutoffs, div_val", [(CUTOFFS, 2), (CUTOFFS, 1), ([], 1)])
def test_nll_equals_the_gathered_log_prob_values_and_gradients(cutoffs, div_val):
    embed, softmax = layers(cutoffs, div_val)
    h = torch.randn(2, V, D, dtype=torch.float64, requires_grad=True)
    y = every_cluster()
    nll = softmax.nll(h, embed, y)  # (2, V)
    gathered = -softmax.log_prob(h, embed).gather(-1, y[..., None])[..., 0]
    torch.testing.assert_close(nll, gathered)
    params = [h, *embed.parameters(), *softmax.parameters()]
    fast = torch.autograd.grad(nll.sum(), params)
    full = torch.autograd.grad(gathered.sum(), params)
    for a, b in zip(fast, full):
        torch.testing.assert_close(a, b)


class _Products(TorchDispatchMode):
    """Records the shapes of the matrix products run inside it."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.shapes.append(tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


def test_tail_clusters_run_the_same_product_shapes_whatever_their_word_counts():
    """With `row_multiple` = ADAPTIVE_ROWS (what the CPU training scope sets), a cluster's rows are padded to a
    multiple of it, so batches with 3 and 9 words of cluster 1 (and 8 and 1 of cluster 2) run the same products
    forward and backward: oneDNN kernels built for one serve the next. The padded rows change no value or gradient;
    with the default 0 the products run on the rows as they come."""

    def run(counts: tuple[int, int], multiple: int) -> tuple[list, list[torch.Tensor]]:
        embed, softmax = layers()
        embed.row_multiple = softmax.row_multiple = multiple
        ids = torch.tensor([0] * 4 + [6] * counts[0] + [15] * counts[1])  # head, cluster 1, cluster 2 words
        ids = torch.cat([ids, torch.zeros(24 - ids.numel(), dtype=torch.long)])  # 24 tokens either way
        h = torch.randn(24, D, dtype=torch.float64, generator=torch.Generator().manual_seed(sum(counts)),
                        requires_grad=True)
        with _Products() as products:
            nll, out = softmax.nll(h, embed, ids), embed(ids)
            (nll.sum() + out.sum()).backward()
        grads = [h.grad, *(p.grad for p in (*embed.parameters(), *softmax.parameters()))]
        return sorted(products.shapes), [nll.detach(), out.detach(), *grads]

    bucketed_runs = [run(counts, ADAPTIVE_ROWS) for counts in ((3, 8), (9, 1))]
    assert bucketed_runs[0][0] == bucketed_runs[1][0]
    assert any(s[0][0] == ADAPTIVE_ROWS for s in bucketed_runs[0][0])  # the tail clusters' products, padded
    plain_runs = [run(counts, 0) for counts in ((3, 8), (9, 1))]
    assert plain_runs[0][0] != plain_runs[1][0]  # without the multiple the shapes follow the word counts
    assert not any(s[0][0] == ADAPTIVE_ROWS for s in plain_runs[0][0])
    for (_, padded), (_, plain) in zip(bucketed_runs, plain_runs):
        for got, want in zip(padded, plain, strict=True):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_bucketed_pads_row_positions_to_the_multiple_with_copies_of_the_first():
    rows = torch.tensor([4, 7, 9])
    assert bucketed(rows, 0) is rows and bucketed(torch.arange(32), ADAPTIVE_ROWS).numel() == 32
    padded = bucketed(rows, ADAPTIVE_ROWS)
    assert padded.numel() == ADAPTIVE_ROWS and torch.equal(padded[:3], rows) and padded[3:].eq(4).all()
    assert bucketed(torch.arange(33), ADAPTIVE_ROWS).numel() == 2 * ADAPTIVE_ROWS


@pytest.mark.parametrize("tie", [True, False])
def test_every_parameter_gets_a_gradient_even_from_a_batch_of_head_words(tie):
    """No unused parameters (DDP), also when a batch holds no word of some cluster."""
    model = tiny(tie_output=tie).float().train()
    x = torch.randint(CUTOFFS[0], (2, 6))  # head words only, in and out
    nll, _ = model(x, targets=x.roll(1, 1))
    nll.sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []
    assert model.embed.tables[1].grad.abs().max() == 0  # ... and the absent clusters' gradients are zero


def test_without_cutoffs_it_is_exactly_the_plain_embedding_and_softmax():
    embed, softmax = layers([], 1)
    assert softmax.cluster_head is None and len(embed.tables) == len(embed.projs) == 0
    ids, h = tokens(3, 5), torch.randn(3, 5, D, dtype=torch.float64)
    logits = F.linear(h, embed.weight, softmax.bias)
    assert torch.equal(embed(ids), F.embedding(ids, embed.weight))
    assert torch.equal(softmax.logits(h, embed), logits)
    assert torch.equal(softmax.log_prob(h, embed), logits.log_softmax(-1))
    plain = F.cross_entropy(logits.view(15, V), ids.view(15), reduction="none").view(3, 5)
    torch.testing.assert_close(softmax.nll(h, embed, ids), plain, rtol=1e-12, atol=1e-12)  # one softmax pass: rounding


def test_a_plain_model_keeps_its_parameters_and_loads_checkpoints_from_before_the_adaptive_softmax():
    for tie in (True, False):
        model = tiny(cutoffs=[], div_val=1, tie_output=tie)
        output = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith("layers.")}
        expected = {"embed.weight": (V, D), "softmax.bias": (V,)} | ({} if tie else {"out_proj.weight": (V, D)})
        assert output == expected
        legacy = dict(model.state_dict())
        legacy["out_bias"] = legacy.pop("softmax.bias")  # the name before issue 3
        fresh = tiny(cutoffs=[], div_val=1, tie_output=tie)
        with torch.no_grad():
            fresh.softmax.bias.zero_()
        fresh.load_state_dict(legacy)
        x = tokens(2, 5)
        assert torch.equal(fresh(x)[0], model(x)[0])


# --- the adaptive input ---------------------------------------------------------------------------
@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_embedding_rows_are_the_projected_cluster_rows(div_val):
    embed, _ = layers(CUTOFFS, div_val)
    dims = [D, D // div_val, D // div_val**2]
    assert tuple(embed.weight.shape) == (5, D)
    assert [tuple(t.shape) for t in embed.tables] == [(7, dims[1]), (11, dims[2])]
    assert [tuple(p.shape) for p in embed.projs] == ([] if div_val == 1 else [(D, dims[1]), (D, dims[2])])
    ids = torch.arange(V).flip(0).view(1, V)
    out = embed(ids)[0].flip(0)  # (V, D): row w = the embedding of id w
    for w in range(V):
        if w < 5:
            expected = embed.weight[w]
        else:
            i = 1 if w < 12 else 2
            row = embed.tables[i - 1][w - [5, 12][i - 1]]
            expected = row if div_val == 1 else embed.projs[i - 1] @ row
        torch.testing.assert_close(out[w], expected, rtol=0, atol=1e-12)
    with pytest.raises(IndexError):  # an id past the vocabulary is an error, not an unwritten row
        embed(torch.tensor([V]))


def test_adaptive_embedding_has_the_plain_embedding_variance():
    torch.manual_seed(0)
    embed = AdaptiveEmbedding(3000, 64, [100, 1000], 4)  # tables of 64, 16, 4 dims
    with torch.no_grad():
        var = embed(torch.arange(3000)).var(dim=1)  # (V,)
    for lo, hi in ((0, 100), (100, 1000), (1000, 3000)):
        assert 0.8 < var[lo:hi].mean().item() * 64 < 1.2, (lo, hi)


def test_model_embeds_scaled_and_ties_tables_and_projections_per_cluster():
    tied, untied = tiny(), tiny(tie_output=False)
    x = tokens(2, 7)
    torch.testing.assert_close(tied.embed_tokens(x), tied.embed(x) * math.sqrt(D))
    assert tied.out_proj is None and tied.output_words() is tied.embed
    ptrs = [p.data_ptr() for p in tied.state_dict().values()]
    assert len(ptrs) == len(set(ptrs)) and not any(k.startswith("out_proj") for k in tied.state_dict())
    assert untied.output_words() is untied.out_proj
    own = {p.data_ptr() for p in untied.out_proj.parameters()}
    assert own.isdisjoint(p.data_ptr() for p in untied.embed.parameters()) and len(own) == 5
    # head words in, rare words out: only the output layer reaches cluster 2's table and projection
    x, y = torch.randint(5, (2, 6)), torch.randint(12, V, (2, 6))
    for model in (tied, untied):
        model.zero_grad()
        model(x, targets=y)[0].sum().backward()
    assert tied.embed.tables[1].grad.abs().sum() > 0 and tied.embed.projs[1].grad.abs().sum() > 0
    assert untied.embed.tables[1].grad.abs().sum() == 0 and untied.out_proj.tables[1].grad.abs().sum() > 0


# --- config ---------------------------------------------------------------------------------------
def test_cutoffs_and_div_val_are_checked():
    for bad in ([5, 5], [0, 3], [7, 3], "5,12", [5.0], [True]):
        with pytest.raises(ConfigError, match="cutoffs"):
            TransformerXLConfig(cutoffs=bad)
    with pytest.raises(ConfigError, match="div_val"):
        TransformerXLConfig(div_val=0)
    with pytest.raises(ConfigError, match="div_val"):
        TransformerXLConfig(d_model=16, n_heads=2, cutoffs=[10, 20, 30], div_val=4)  # 16 // 64 = 0 dimensions
    with pytest.raises(ConfigError, match="vocabulary size 23"):
        tiny(cutoffs=[5, 23])
    cfg = cfgmod.resolve([], ["model.cutoffs=[5,12]", "model.div_val=2"], cls=cfgmod.LMRunConfig)
    assert cfg.model.cutoffs == [5, 12] and TransformerXLConfig(cutoffs=(5, 12)).cutoffs == [5, 12]
    again = cfgmod.from_dict(cfgmod.LMRunConfig, json.loads(json.dumps(cfgmod.to_dict(cfg))))
    assert again == cfg
    wt2 = cfgmod.resolve(["lm-word-wt2"], cls=cfgmod.LMRunConfig).model
    assert wt2.cutoffs == [2000, 10000] and wt2.div_val == 2 and wt2.tie_output


# --- the models: evaluation and sampling on log-probabilities -------------------------------------
def test_adaptive_xl_segments_equal_the_whole_sequence_and_its_log_probs():
    model = tiny()
    x = tokens(2, 12)
    whole = model(x)[0]  # (2, 12, V) log-probabilities
    torch.testing.assert_close(whole.logsumexp(-1), torch.zeros(2, 12, dtype=torch.float64), rtol=0, atol=1e-12)
    nll = model(x[:, :-1], targets=x[:, 1:])[0]  # (2, 11)
    torch.testing.assert_close(nll, -whole[:, :-1].gather(-1, x[:, 1:, None])[..., 0])
    scores = evaluate_segments(model, x[0], tgt_len=4, mem_len=12, batch_size=1)
    assert scores.tokens == 11 and math.isclose(scores.nll, nll[0].sum().item(), rel_tol=1e-9)


def test_adaptive_vanilla_sliding_window_equals_the_per_token_loop():
    model = tiny("vanilla-lm")
    ids = tokens(20, seed=7)
    scores = evaluate_sliding_window(model, ids, window=6, batch_size=4)
    nll = -sum(model(ids[max(0, p - 6) : p][None])[0][0, -1, ids[p]].item() for p in range(1, 20))
    assert scores.tokens == 19 and math.isclose(scores.nll, nll, rel_tol=1e-9)


def test_adaptive_sampling_with_memory_equals_sampling_from_the_probabilities():
    model = tiny()
    prompt = tokens(1, 4, seed=9)
    fast = generate(model, prompt, 8, ContextRule(segment=4, memory=32), top_k=6,
                    generator=torch.Generator().manual_seed(3))
    g, context = torch.Generator().manual_seed(3), prompt
    for _ in range(8):
        probs = model(context)[0][:, -1].exp()  # (1, V): the distribution itself
        kth = probs.topk(6).values[:, -1:]
        context = torch.cat([context, torch.multinomial(probs.masked_fill(probs < kth, 0).float(), 1, generator=g)], 1)
    assert torch.equal(fast, context[:, 4:])


# --- end to end -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def word_data(tmp_path_factory):
    """A word-level corpus with a Zipf-like vocabulary of 40 words (+ <unk>, <eos>)."""
    from attnkit.data.lm import prepare_lm

    g = torch.Generator().manual_seed(0)
    probs = 1.0 / torch.arange(1, 41, dtype=torch.float64)
    lines = [" ".join(f"w{int(i)}" for i in torch.multinomial(probs, 9, True, generator=g)) for _ in range(300)]
    root = tmp_path_factory.mktemp("adaptive")
    (root / "words.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = prepare_lm(root / "data", root / "words.txt", level="word", valid_fraction=0.1)
    assert corpus.vocab.vocab_size == 42
    return root / "data"


ADAPTIVE = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=2", "model.dropout=0.0",
            "model.cutoffs=[6,16]", "model.div_val=2", "train.tgt_len=8", "train.mem_len=8", "train.batch_size=8",
            "train.eval_batch_size=4", "train.device=cpu", "train.eval_interval=100", "train.log_every=1",
            "train.schedule=constant", "train.lr=0.01", "train.max_steps=10", "train.eval_max_tokens=256"]


def test_tiny_adaptive_xl_trains_round_trips_and_evaluates(capsys, tmp_path, word_data):
    cfg = cfgmod.resolve([], ADAPTIVE, cls=cfgmod.LMRunConfig)
    trainer = LMTrainer(cfg, word_data, tmp_path / "run", progress=False)
    assert trainer.model.config.cutoffs == [6, 16] and len(trainer.model.embed.projs) == 2
    losses = [trainer.train_step()["loss"] for _ in range(8)]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses  # from about log 42 = 3.7 down
    metrics = trainer.fit()  # to max_steps, validation, checkpoints
    assert trainer.state.step == 10 and math.isfinite(metrics["loss"]) and metrics["loss"] < losses[0]

    ckpt = tmp_path / "run" / "checkpoints" / "last.safetensors"
    model, vocab, run_cfg = load_lm_checkpoint(ckpt)
    assert run_cfg.model.cutoffs == [6, 16] and run_cfg.model.div_val == 2
    for (name, a), b in zip(trainer.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    x = torch.randint(42, (1, 8))
    torch.testing.assert_close(model(x)[0], trainer.model.eval()(x)[0], rtol=0, atol=0)

    code = main(["lm", "eval", "--checkpoint", str(ckpt), "--data", str(word_data), "--device", "cpu",
                 "--batch-size", "4", "--max-tokens", "256", "--sliding-window", "8"])  # as the trainer evaluates
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "transformer-xl on valid" in out and "sliding window of 8" in out
    assert float(out.split("loss ")[1].split()[0]) == round(metrics["loss"], 4)
    code = main(["lm", "generate", "--checkpoint", str(ckpt), "--prompt", "w0 w1", "--length", "12", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("w0 w1") and len(out.split()) >= 3
