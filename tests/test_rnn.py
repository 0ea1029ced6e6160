"""RNN encoder-decoders (issue 5) against naive references: alignments, padding, caching, search, training."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.cli.main import main
from attnkit.config import RNNConfig
from attnkit.data import BOS_ID, EOS_ID, PAD_ID
from attnkit.data.batching import Batch
from attnkit.decode import Translator, beam_search, greedy_search
from attnkit.errors import AttnkitError, ConfigError
from attnkit.models import build_model
from attnkit.models.rnn import Attended, HardAttentionSeq2Seq, reverse_padded
from attnkit.train.losses import label_smoothed_nll
from attnkit.train.trainer import model_losses

V = 24
# (kind, config changes): every variant, and the options that change the computation
VARIANTS = [
    ("rnn-seq2seq", {}),
    ("rnn-seq2seq", {"reverse_source": True, "bidirectional": False}),
    ("rnn-bahdanau", {}),
    ("rnn-bahdanau", {"cell": "lstm", "n_decoder_layers": 2, "reverse_source": True}),
    ("rnn-luong", {"score": "dot"}),
    ("rnn-luong", {"score": "general", "input_feeding": False, "cell": "lstm"}),
    ("rnn-luong", {"score": "concat", "attention_dim": 10}),
    ("rnn-luong", {"score": "cosine", "cell": "lstm"}),
    ("rnn-hard", {}),
    ("rnn-hard", {"estimator": "gumbel", "cell": "lstm"}),
]
ATTENTIVE = [v for v in VARIANTS if v[0] != "rnn-seq2seq"]
IDS = [f"{k}-{'-'.join(f'{a}={b}' for a, b in kw.items()) or 'default'}" for k, kw in VARIANTS]


def config(kind: str, **kw) -> RNNConfig:
    base = dict(kind=kind, src_vocab_size=V, tgt_vocab_size=V, embed_dim=12, hidden=16, dropout=0.0)
    return RNNConfig(**{**base, **kw})


def model(kind: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_model(kind, config(kind, **kw)).eval()


def sources() -> torch.Tensor:
    """(4, 7) sources of lengths 7, 5, 7, 3, each ending in EOS, right-padded."""
    src = torch.randint(4, V, (4, 7), generator=torch.Generator().manual_seed(3))
    for row, n in enumerate([7, 5, 7, 3]):
        src[row, n - 1] = EOS_ID
        src[row, n:] = PAD_ID
    return src


def targets() -> torch.Tensor:
    tgt = torch.randint(4, V, (4, 6), generator=torch.Generator().manual_seed(4))
    tgt[:, 0] = BOS_ID
    return tgt


def test_reverse_padded_against_a_python_loop():
    x = sources()
    lengths = x.ne(PAD_ID).sum(1)
    expected = [row[:n][::-1] + row[n:] for row, n in zip(x.tolist(), lengths.tolist())]
    assert reverse_padded(x, lengths).tolist() == expected
    h = torch.randn(4, 7, 3)
    assert torch.equal(reverse_padded(h, lengths)[1, :5], h[1, :5].flip(0))


@pytest.mark.parametrize(("kind", "kw"), ATTENTIVE, ids=[i for i, v in zip(IDS, VARIANTS) if v in ATTENTIVE])
def test_attention_weights_are_a_distribution_over_real_source_positions(kind, kw):
    m, src = model(kind, **kw), sources()
    logits, maps = m.attention(src, targets())
    w = maps["cross"][0]  # (B, 1, T, S)
    assert w.shape == (4, 1, 6, 7) and logits.shape == (4, 6, V)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 1, 6))
    assert (w >= 0).all() and w.masked_select(src.eq(PAD_ID)[:, None, None, :].expand_as(w)).eq(0).all()


def naive_scores(m, kind: str, kw: dict, before, after) -> torch.Tensor:
    """Scores of one step written out per source position j, from the states around the step."""
    b, s = before.memory.shape[:2]
    out = torch.empty(b, s)
    for i in range(b):
        for j in range(s):
            h_j = before.memory[i, j]
            if kind in ("rnn-bahdanau", "rnn-hard"):  # v . tanh(W s_{t-1} + U h_j)
                e = torch.tanh(m.query_proj.weight @ before.hidden[-1, i] + m.query_proj.bias + m.key_proj.weight @ h_j)
                out[i, j] = m.score_v.weight[0] @ e
            elif kw.get("score") == "dot":  # s_t . h_j
                out[i, j] = after.hidden[-1, i] @ h_j
            elif kw.get("score") == "concat":  # v_a . tanh(W_a [s_t; h_j])
                w_a = torch.cat([m.query_proj.weight, m.key_proj.weight], 1)  # (A, 2H)
                out[i, j] = m.score_v.weight[0] @ torch.tanh(w_a @ torch.cat([after.hidden[-1, i], h_j]))
            elif kw.get("score") == "cosine":  # beta cos(s_t, h_j)
                s_t = after.hidden[-1, i]
                out[i, j] = m.log_beta.exp() * (s_t @ h_j) / (s_t.norm() * h_j.norm())
            else:  # s_t . W_a h_j
                out[i, j] = after.hidden[-1, i] @ (m.key_proj.weight @ h_j)
    return out


@pytest.mark.parametrize(("kind", "kw"), ATTENTIVE, ids=[i for i, v in zip(IDS, VARIANTS) if v in ATTENTIVE])
def test_step_weights_match_scores_written_out_position_by_position(kind, kw):
    m, src = model(kind, **kw), sources()
    state = m.init_state(m.encode(src))
    for token in targets().T[:3]:  # a few steps, so later states are not the initial ones
        _, after, (w,) = m.step(token, state, need_weights=True)
        probs = naive_scores(m, kind, kw, state, after).masked_fill(src.eq(PAD_ID), float("-inf")).softmax(-1)
        if kind == "rnn-hard":  # inference: all weight on the most probable position
            probs = torch.nn.functional.one_hot(probs.argmax(-1), src.size(1)).float()
        torch.testing.assert_close(w[:, 0], probs, atol=1e-5, rtol=1e-4)
        state = after


@pytest.mark.parametrize(("kind", "kw"), VARIANTS, ids=IDS)
def test_padding_never_changes_outputs_at_real_positions(kind, kw):
    m, src, tgt = model(kind, **kw), sources(), targets()
    batch = m(src, tgt)
    wider = m(torch.cat([src, torch.zeros(4, 3, dtype=torch.long)], 1), tgt)  # three more padding columns
    torch.testing.assert_close(wider, batch, atol=1e-5, rtol=1e-4)
    for row, n in enumerate(src.ne(PAD_ID).sum(1).tolist()):  # each sentence alone, without padding
        alone = m(src[row : row + 1, :n], tgt[row : row + 1])
        torch.testing.assert_close(alone[0], batch[row], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("kind", "kw"), VARIANTS, ids=IDS)
def test_cached_step_by_step_decoding_equals_the_full_forward(kind, kw):
    m, src, tgt = model(kind, **kw), sources(), targets()
    full = m(src, tgt).log_softmax(-1)  # (B, T, V)
    state = m.init_state(m.encode(src))
    for t in range(tgt.size(1)):
        logp, state, _ = m.step(tgt[:, t], state)
        torch.testing.assert_close(logp, full[:, t], atol=1e-5, rtol=1e-4)
    assert state.length == tgt.size(1)


@pytest.mark.parametrize(("kind", "kw"), VARIANTS, ids=IDS)
def test_training_loss_from_the_output_layers_input_equals_the_loss_of_the_logits(kind, kw):
    """model_losses hands `features` and `output_layer` to the projected loss: the same losses and gradients as
    label_smoothed_nll over forward's logits, dropout (the same draws, in the same order) and sampling included."""
    m = build_model(kind, config(kind, dropout=0.3, **kw)).double().train()
    tgt_in = targets()
    tgt_out = torch.roll(tgt_in, -1, 1)  # y + EOS
    tgt_out[:, -1] = EOS_ID
    tgt_out[1, 3:] = PAD_ID  # a shorter target: padding is not scored
    batch = Batch(sources(), tgt_in, tgt_out, torch.arange(4))

    def losses_and_grads(losses):
        torch.manual_seed(5)
        loss, nll = losses()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        m.zero_grad(set_to_none=True)
        return loss.detach(), nll.detach(), grads

    projected = losses_and_grads(lambda: model_losses(m, batch, 0.1))
    whole = losses_and_grads(lambda: label_smoothed_nll(m(batch.src, batch.tgt_in), batch.tgt_out, 0.1, PAD_ID))
    for a, b in zip(projected[:2], whole[:2]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert projected[2].keys() == whole[2].keys() and "out_proj.weight" in whole[2]
    for name, g in whole[2].items():
        torch.testing.assert_close(projected[2][name], g, rtol=1e-10, atol=1e-12, msg=name)


def test_reversing_the_source_reads_it_backwards():
    src, tgt = sources(), targets()
    backwards = model("rnn-seq2seq", reverse_source=True)(src, tgt)
    forwards = model("rnn-seq2seq", reverse_source=False)  # the same weights (same seed)
    torch.testing.assert_close(backwards, forwards(reverse_padded(src, src.ne(PAD_ID).sum(1)), tgt))
    assert not torch.allclose(backwards, forwards(src, tgt))


@pytest.mark.parametrize(("kind", "kw"), VARIANTS, ids=IDS)
def test_beam_size_one_equals_greedy(kind, kw):
    m, src = model(kind, **kw), sources()
    greedy = greedy_search(m, src, max_len_a=0.0, max_len_b=8)
    # ranked by the summed log-probability (no length normalisation), as greedy search ranks
    beam = beam_search(m, src, beam=1, len_penalty=0.0, max_len_a=0.0, max_len_b=8)
    for g, b in zip(greedy, beam):
        assert g[0].tokens == b[0].tokens
        assert math.isclose(g[0].score, b[0].score, rel_tol=1e-5, abs_tol=1e-5)


def test_beam_search_reorders_the_state_rows():
    m, src = model("rnn-luong", cell="lstm"), sources()
    state = m.init_state(m.encode(src))
    rows = torch.tensor([3, 3, 0])
    moved = state.reorder(rows)
    assert torch.equal(moved.hidden, state.hidden[:, rows]) and torch.equal(moved.cell, state.cell[:, rows])
    assert torch.equal(moved.memory, state.memory[rows]) and torch.equal(moved.feed, state.feed[rows])
    assert torch.equal(moved.pad_mask, state.pad_mask[rows]) and torch.equal(moved.keys, state.keys[rows])


def test_hard_attention_puts_all_weight_on_one_position_at_inference():
    m, src = model("rnn-hard"), sources()
    state = m.init_state(m.encode(src))
    for token in targets().T:
        _, state, (w,) = m.step(token, state, need_weights=True)
        assert w.eq(1).sum(-1).eq(1).all() and w.sum(-1).eq(1).all()  # exactly one position, weight 1
        assert not w[:, 0].masked_select(src.eq(PAD_ID)).any()
    soft = model("rnn-bahdanau")  # the same weights: soft attention averages, hard picks one state
    assert not torch.allclose(soft(src, targets()), m(src, targets()))


def test_hard_attention_samples_in_training():
    m = model("rnn-hard").train()
    picks = {tuple(m.attention(sources(), targets())[1]["cross"][0].argmax(-1).flatten().tolist()) for _ in range(5)}
    assert len(picks) > 1


def test_reinforce_term_against_a_written_out_reference():
    torch.manual_seed(0)
    m = HardAttentionSeq2Seq(config("rnn-hard")).train()
    b, t, s = 2, 4, 5
    logits = torch.randn(b, t, V)
    tgt_out = torch.tensor([[5, 6, EOS_ID, PAD_ID], [7, 8, 9, EOS_ID]])
    log_probs = [torch.randn(b, s).log_softmax(-1).requires_grad_() for _ in range(t)]
    picks = torch.tensor([[0, 3, 1, 2], [4, 4, 0, 1]])
    attended = [Attended(torch.nn.functional.one_hot(picks[:, i], s).float(), log_probs[i]) for i in range(t)]
    loss = m._reinforce_loss(logits, attended, tgt_out)
    token_logp = logits.log_softmax(-1)
    rewards = {}  # (row, step) -> mean log-likelihood of the tokens from that step to the sentence's end
    for row in range(b):
        n = int(tgt_out[row].ne(PAD_ID).sum())
        for i in range(n):
            rewards[row, i] = sum(float(token_logp[row, u, tgt_out[row, u]]) for u in range(i, n)) / (n - i)
    baseline = sum(rewards.values()) / len(rewards)  # the first batch starts the moving average
    expected = -sum((r - baseline) * log_probs[i][row, picks[row, i]] for (row, i), r in rewards.items())
    torch.testing.assert_close(loss, expected)
    assert math.isclose(float(m.reward_baseline), baseline, rel_tol=1e-5)


@pytest.mark.parametrize("estimator", ["reinforce", "gumbel"])
def test_only_the_estimator_trains_the_hard_scorer(estimator):
    m = model("rnn-hard", estimator=estimator).train()
    tgt_in = targets()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((4, 1), EOS_ID)], 1)
    batch = Batch(sources(), tgt_in, tgt_out, torch.arange(4))
    logits, aux = logits_and_aux(m, batch)
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt_out.reshape(-1), reduction="sum")
    nll.backward(retain_graph=True)
    through_likelihood = m.query_proj.weight.grad
    if estimator == "reinforce":  # a sampled one-hot passes no gradient: the scorer learns from REINFORCE only
        assert through_likelihood is None and aux.requires_grad
        aux.backward()
        assert m.query_proj.weight.grad.abs().sum() > 0
    else:  # straight-through: the relaxed sample's gradient reaches the scorer, no extra term
        assert through_likelihood.abs().sum() > 0 and float(aux) == 0.0


def logits_and_aux(m, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | float]:
    """The logits of the model's `training_features` and the term beside them, as the trainer gets both."""
    features, aux = m.training_features(batch.src, batch.tgt_in, batch.tgt_out)
    return torch.nn.functional.linear(features, *m.output_layer()), aux


def copy_batches(n: int, seed: int) -> list[Batch]:
    """A copy task over 6 symbols: the target is the source (lengths 3-6)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(3, 7, (12,), generator=g)
        src = torch.full((12, 7), PAD_ID)
        for row, k in enumerate(lengths.tolist()):
            src[row, :k] = torch.randint(4, 10, (k,), generator=g)
        tgt_out = src.clone()
        tgt_out[torch.arange(12), lengths] = EOS_ID
        src[torch.arange(12), lengths] = EOS_ID
        tgt_in = torch.cat([torch.full((12, 1), BOS_ID), tgt_out[:, :-1]], 1).masked_fill(tgt_out.eq(PAD_ID), PAD_ID)
        out.append(Batch(src, tgt_in, tgt_out, torch.arange(12)))
    return out


# every kind, each of Luong's scores and both hard-attention estimators (the variants that do not reverse the source)
TRAINED = [i for i, (_, kw) in enumerate(VARIANTS) if not kw.get("reverse_source")]


@pytest.mark.parametrize(("kind", "kw"), [VARIANTS[i] for i in TRAINED], ids=[IDS[i] for i in TRAINED])
def test_every_variant_trains_with_decreasing_loss_and_decodes(kind, kw):
    m = model(kind, seed=1, **kw).train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    batches, losses = copy_batches(4, seed=2), []
    for step in range(20):
        batch = batches[step % 4]
        logits, aux = logits_and_aux(m, batch)  # the trainer's own call, auxiliary terms included
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, V), batch.tgt_out.reshape(-1),
                                                ignore_index=PAD_ID, reduction="sum")
        opt.zero_grad()
        ((nll + aux) / batch.n_tokens).backward()
        opt.step()
        losses.append(nll.item() / batch.n_tokens)
    assert sum(losses[-4:]) < 0.85 * sum(losses[:4]), losses  # the same four batches, later
    m.eval()
    src = batches[0].src[:4]
    for hyps in (greedy_search(m, src, max_len_b=8), beam_search(m, src, beam=3, nbest=2, max_len_b=8)):
        assert len(hyps) == 4 and all(h and all(4 <= tok < V for tok in h[0].tokens) for h in hyps)


def test_the_fixed_vector_model_refuses_to_draw_attention():
    m = model("rnn-seq2seq")
    with pytest.raises(AttnkitError, match="no attention"):
        m.step(targets()[:, 0], m.init_state(m.encode(sources())), need_weights=True)
    with pytest.raises(AttnkitError, match="no attention"):
        m.attention(sources(), targets())


def test_config_errors_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="model.cell"):
        config("rnn-bahdanau", cell="rnn")
    with pytest.raises(ConfigError, match="model.kind"):
        config("rnn-transformer")
    with pytest.raises(ConfigError, match="even"):
        config("rnn-bahdanau", hidden=15)
    assert config("rnn-luong").d_model == 16  # what the noam schedule scales by


def test_train_translate_and_align_from_the_command_line(capsys, tmp_path, data_dir, corpus_files):
    from attnkit.checkpoint import load_checkpoint

    run = tmp_path / "run"
    assert main(["train", "--config", "rnn-bahdanau", "--data", data_dir, "--out", run, "--quiet",
                 "--model.hidden=16", "--model.embed_dim=16", "--train.max_steps=4", "--train.max_tokens=300",
                 "--train.device=cpu", "--train.eval_max_sentences=8"]) == 0
    ckpt = load_checkpoint(run / "checkpoints" / "best.safetensors")
    assert ckpt.kind == "rnn-bahdanau" and isinstance(ckpt.config.model, RNNConfig)
    assert ckpt.config.model.hidden == 16 and ckpt.config.model.share_embeddings
    hyp = tmp_path / "hyp.en"
    assert main(["translate", "--checkpoint", run / "checkpoints" / "best.safetensors", "--input",
                 corpus_files["test"][0], "--output", hyp, "--device", "cpu"]) == 0
    assert len(hyp.read_text().splitlines()) == 30
    capsys.readouterr()
    assert main(["translate", "--checkpoint", run / "checkpoints" / "last.safetensors", "--input",
                 corpus_files["test"][0], "--beam", "2", "--format", "tsv", "--print-alignment",
                 "--device", "cpu"]) == 0
    header, *rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 30 and all(len(r) == len(header) == 8 for r in rows)
    t = Translator.from_checkpoint(run / "checkpoints" / "last.safetensors", device="cpu")
    out = t.translate(["einundzwanzig"], need_attention=True)[0]
    assert out.attention.shape == (len(out.tgt_pieces) + 1, 1, len(out.src_pieces))
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(len(out.tgt_pieces) + 1, 1))


def test_the_trainer_trains_hard_attention_with_its_reinforce_hook(tmp_path, data_dir):
    from attnkit.config import RunConfig, TrainConfig
    from attnkit.train.trainer import Trainer

    cfg = RunConfig(model=config("rnn-hard"), train=TrainConfig(max_tokens=300, lr=3e-3, schedule="constant",
                                                               eval_bleu=False, max_steps=3, device="cpu"))
    trainer = Trainer(cfg, data_dir, tmp_path / "run", progress=False)
    assert trainer.cfg.model.src_vocab_size == trainer.src_tok.vocab_size  # fitted to the data
    assert math.isnan(float(trainer.model.reward_baseline))
    metrics = trainer.fit()
    assert trainer.state.step == 3 and math.isfinite(metrics["loss"])
    assert math.isfinite(float(trainer.model.reward_baseline))  # the REINFORCE term ran
