"""Tests for polyfuse.nn.decoding: the MAF caption decoder (HOCA section 4.4, Eq. 18-24).

The reference decoder below is written from the equations with explicit loops: the
LSTM cell's gate equations, unary (Eq. 2-3) and binary (Eq. 7-9, n = 2) attention,
Eq. 19 in both forms, the contexts (Eq. 5), the modality attention (Eq. 20-21)
and the output (Eq. 22-23). It reads the module's parameters and calls none of
polyfuse's functions.
"""

from __future__ import annotations

import math

import pytest
import torch

from polyfuse.nn.decoding import CaptionDecoder, caption_cross_entropy

F64 = torch.float64
DIMS, LENGTHS, VOCAB = [3, 2], [4, 3], 7


def make_decoder(combination="log", seed=0):
    torch.manual_seed(seed)
    decoder = CaptionDecoder(DIMS, VOCAB, embed_dim=4, hidden_dim=5, orders="UB",
                             attention_dim=3, combination=combination).double()
    with torch.no_grad():
        for theta in decoder.maf.order_weights:
            theta.uniform_(0.5, 2.0)
    return decoder


def make_inputs(seed=1, batch=3):
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(batch, t, d, generator=gen, dtype=F64) for d, t in zip(DIMS, LENGTHS,
                                                                                  strict=True)]
    masks = [torch.ones(batch, t, dtype=torch.bool) for t in LENGTHS]
    masks[0][1, 2:] = False
    masks[1][2, 1:] = False
    return inputs, masks


def softmax_real(scores, real):
    top = max(s for s, m in zip(scores, real, strict=True) if m)
    exps = [math.exp(s - top) if m else 0.0 for s, m in zip(scores, real, strict=True)]
    return [e / sum(exps) for e in exps]


def sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


@torch.no_grad()
def reference_step(decoder, word, hidden, cell, xs, real):
    """One step for one sample: returns (logits (V,), h, c, attention per modality)."""
    lstm = decoder.lstm
    gates = (lstm.weight_ih @ decoder.embedding.weight[word] + lstm.bias_ih
             + lstm.weight_hh @ hidden + lstm.bias_hh)
    i, f, g, o = gates.chunk(4)
    cell = sigmoid(f) * cell + sigmoid(i) * torch.tanh(g)
    hidden = sigmoid(o) * torch.tanh(cell)
    maf = decoder.maf

    def mapped(qp, fp, x):  # Eq. 3 inside: tanh(W h + b + U x_r)
        return [torch.tanh(qp.weight @ hidden + qp.bias + fp.weight @ x[r])
                for r in range(x.shape[0])]

    terms = [[], []]
    for key, term in maf.terms.items():
        if key in ("0", "1"):  # unary, Eq. 2-3
            m = int(key)
            vectors = mapped(term.query_projection, term.feature_projection, xs[m])
            terms[m].append(softmax_real([float(term.score_vector @ v) for v in vectors],
                                         real[m]))
        else:  # binary exact HOCA, Eq. 7-9 with n = 2
            vectors = [mapped(qp, fp, x) for qp, fp, x in zip(
                term.mapping.query_projections, term.mapping.feature_projections, xs,
                strict=True)]
            for target, other in ((0, 1), (1, 0)):
                weight = term.weights[target]
                scores = [
                    sum(float(weight[s]) * float((vectors[target][r] * vectors[other][s]).sum())
                        for s in range(xs[other].shape[0]) if real[other][s])
                    for r in range(xs[target].shape[0])
                ]
                terms[target].append(softmax_real(scores, real[target]))
    attentions, contexts = [], []
    for m in range(2):
        theta = maf.order_weights[m]
        scores = []
        for r in range(xs[m].shape[0]):
            values = [t[r] for t in terms[m]]
            if maf.combination == "literal":
                scores.append(sum(float(w) * a for w, a in zip(theta, values, strict=True)))
            else:
                scores.append(sum(float(w) * math.log(a) for w, a in zip(theta, values,
                                                                        strict=True))
                              if real[m][r] else 0.0)
        attention = softmax_real(scores, real[m])  # Eq. 19
        attentions.append(attention)
        contexts.append(sum(a * xs[m][r] for r, a in enumerate(attention)))  # Eq. 5
    e = [float(maf.fusion_score @ torch.tanh(maf.fusion_query.weight @ hidden
                                             + maf.fusion_query.bias
                                             + maf.fusion_contexts[m].weight @ contexts[m]))
         for m in range(2)]  # Eq. 21
    beta = softmax_real(e, [True, True])  # Eq. 20
    logits = (decoder.state_output.weight @ hidden + decoder.state_output.bias
              + sum(beta[m] * (maf.output_projections[m].weight @ contexts[m])
                    for m in range(2)))  # Eq. 22-23
    return logits, hidden, cell, attentions


@torch.no_grad()
def reference_initial_state(decoder, xs, real):
    means = [sum(x[r] for r in range(x.shape[0]) if m[r]) / sum(m) for x, m in zip(xs, real,
                                                                                   strict=True)]
    pooled = torch.cat(means)
    return (torch.tanh(decoder.initial_hidden.weight @ pooled + decoder.initial_hidden.bias),
            torch.tanh(decoder.initial_cell.weight @ pooled + decoder.initial_cell.bias))


def sample(inputs, masks, b):
    return [x[b] for x in inputs], [m[b].tolist() for m in masks]


@pytest.mark.parametrize("combination", ["log", "literal"])
def test_teacher_forcing_is_eq_22_step_by_step(combination):
    decoder = make_decoder(combination)
    inputs, masks = make_inputs()
    captions = torch.tensor([[1, 4, 5, 2], [1, 3, 2, 0], [1, 6, 6, 6]])
    logits = decoder(captions, inputs, masks)
    assert logits.shape == (3, 3, VOCAB)
    for b in range(3):
        xs, real = sample(inputs, masks, b)
        hidden, cell = reference_initial_state(decoder, xs, real)
        for t in range(3):
            expected, hidden, cell, _ = reference_step(decoder, int(captions[b, t]), hidden,
                                                       cell, xs, real)
            torch.testing.assert_close(logits[b, t], expected, rtol=0, atol=1e-12)


def test_greedy_takes_the_argmax_and_pads_after_the_end_token():
    decoder = make_decoder()
    inputs, masks = make_inputs(seed=2)
    # the word sample 0 picks at its second step is the end token: it stops there
    xs, real = sample(inputs, masks, 0)
    hidden, cell = reference_initial_state(decoder, xs, real)
    logits, hidden, cell, _ = reference_step(decoder, 1, hidden, cell, xs, real)
    logits, _, _, _ = reference_step(decoder, int(logits[2:].argmax()) + 2, hidden, cell, xs, real)
    end = int(logits[2:].argmax()) + 2
    tokens, steps = decoder.greedy(inputs, masks, begin_index=1, end_index=end, max_length=5)
    for b in range(3):
        xs, real = sample(inputs, masks, b)
        hidden, cell = reference_initial_state(decoder, xs, real)
        word, finished, expected = 1, False, []
        for t in range(tokens.shape[1]):
            logits, hidden, cell, attention = reference_step(decoder, word, hidden, cell, xs,
                                                             real)
            word = int(logits[2:].argmax()) + 2  # padding (0) and begin (1) are never generated
            expected.append(0 if finished else word)
            for m in range(2):
                torch.testing.assert_close(
                    steps[t].attention[m][b], torch.tensor(attention[m], dtype=F64),
                    rtol=0, atol=1e-12)
            finished = finished or word == end
        assert tokens[b].tolist() == expected
    assert tokens[0, 1] == end and bool((tokens[0, 2:] == 0).all())
    assert tokens.shape[1] <= 5


def test_caption_cross_entropy_is_eq_24_per_token():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, VOCAB, generator=gen, dtype=F64)
    targets = torch.tensor([[4, 2, 0], [5, 6, 2]])
    terms = [
        -(logits[b, t, targets[b, t]] - math.log(sum(math.exp(v) for v in logits[b, t])))
        for b in range(2) for t in range(3) if targets[b, t] != 0
    ]
    expected = sum(terms) / len(terms)
    assert abs(float(caption_cross_entropy(logits, targets)) - float(expected)) < 1e-12


def test_bad_input_is_refused_with_a_clear_error():
    decoder = make_decoder()
    inputs, masks = make_inputs()
    with pytest.raises(ValueError, match=r"token ids outside \[0, 6\]"):
        decoder(torch.tensor([[1, 7], [1, 2], [1, 2]]), inputs, masks)
    with pytest.raises(ValueError, match="L >= 2"):
        decoder(torch.tensor([[1], [1], [1]]), inputs, masks)
    with pytest.raises(ValueError, match="batch size 2, the features 3"):
        decoder(torch.tensor([[1, 2], [1, 2]]), inputs, masks)
    with pytest.raises(ValueError, match="LongTensor"):
        decoder(torch.ones(3, 2), inputs, masks)
    with pytest.raises(ValueError, match="modality 1 has feature size 3"):
        decoder(torch.tensor([[1, 2]] * 3), [inputs[0], inputs[0]], None)
    with pytest.raises(ValueError, match="end_index 9 is not a token id"):
        decoder.greedy(inputs, masks, begin_index=1, end_index=9)
    with pytest.raises(ValueError, match="padding_index 7"):
        CaptionDecoder(DIMS, VOCAB, padding_index=7)


def reference_lstm(decoder, embedded, hidden, cell):
    """The LSTM cell's gate equations (i, f, g, o) for one sample."""
    lstm = decoder.lstm
    gates = lstm.weight_ih @ embedded + lstm.bias_ih + lstm.weight_hh @ hidden + lstm.bias_hh
    i, f, g, o = gates.chunk(4)
    cell = sigmoid(f) * cell + sigmoid(i) * torch.tanh(g)
    return sigmoid(o) * torch.tanh(cell), cell


def test_mean_pooled_baseline_sees_the_same_masked_means_every_step():
    """orders=None: p_t = softmax(W_p^h h_t + b_p + sum_k W_p^k mean(x_k)), uniform attention."""
    torch.manual_seed(4)
    decoder = CaptionDecoder(DIMS, VOCAB, embed_dim=4, hidden_dim=5, orders=None).double()
    assert not hasattr(decoder.maf, "terms")
    inputs, masks = make_inputs(seed=4)
    captions = torch.tensor([[1, 4, 5], [1, 3, 2], [1, 6, 6]])
    logits = decoder(captions, inputs, masks)
    with torch.no_grad():
        for b in range(3):
            xs, real = sample(inputs, masks, b)
            means = [sum(x[r] for r in range(x.shape[0]) if m[r]) / sum(m) for x, m in zip(xs, real, strict=True)]
            fused = sum(p.weight @ mean for p, mean in zip(decoder.maf.output_projections, means, strict=True))
            hidden, cell = reference_initial_state(decoder, xs, real)
            for t in range(2):
                hidden, cell = reference_lstm(decoder, decoder.embedding.weight[captions[b, t]], hidden, cell)
                expected = decoder.state_output.weight @ hidden + decoder.state_output.bias + fused
                torch.testing.assert_close(logits[b, t], expected, rtol=0, atol=1e-12)
        sequences, full = decoder.prepare(inputs, masks)
        step = decoder.step(captions[:, 0], decoder.initial_state(sequences, full), sequences, full)
    for m in range(2):
        count = masks[m].sum(-1, keepdim=True)
        torch.testing.assert_close(step.attention[m], masks[m].float() / count, rtol=0, atol=0)  # float32
    torch.testing.assert_close(step.modality_weights, torch.full((3, 2), 0.5, dtype=F64), rtol=0, atol=0)


def test_dropout_drops_the_word_embedding_and_the_state_term_only():
    """With p = 1 dropout is deterministic (all zero): the LSTM reads zeros and Eq. 22's
    state term keeps only b_p, while MAF still attends from the undropped h_t."""
    decoder = make_decoder()
    dropped = CaptionDecoder(DIMS, VOCAB, embed_dim=4, hidden_dim=5, orders="UB", attention_dim=3,
                             dropout=1.0).double()
    dropped.load_state_dict(decoder.state_dict())
    dropped.train()
    inputs, masks = make_inputs(seed=5)
    captions = torch.tensor([[1, 4, 5], [1, 3, 2], [1, 6, 6]])
    logits = dropped(captions, inputs, masks)
    for b in range(3):
        xs, real = sample(inputs, masks, b)
        hidden, cell = reference_initial_state(decoder, xs, real)
        for t in range(2):
            with torch.no_grad():
                new_hidden, _new_cell = reference_lstm(decoder, torch.zeros(4, dtype=F64), hidden, cell)
            # reference_step's LSTM reads word 0 (padding), whose embedding is zero: the same input
            full, hidden, cell, _ = reference_step(decoder, 0, hidden, cell, xs, real)
            torch.testing.assert_close(hidden, new_hidden, rtol=0, atol=1e-12)
            expected = full - decoder.state_output.weight.detach() @ hidden
            torch.testing.assert_close(logits[b, t], expected, rtol=0, atol=1e-12)
    dropped.eval()  # no dropout in evaluation
    torch.testing.assert_close(dropped(captions, inputs, masks), decoder(captions, inputs, masks), rtol=0, atol=0)


def test_constructor_passes_its_options_to_maf_and_checks_its_sizes():
    decoder = CaptionDecoder([3, 2, 4], 9, orders="UBT", low_rank=True, attention_dim=6, rank=3,
                             max_lengths=[5, 6, 7], combination="literal", padding_index=4)
    maf = decoder.maf
    assert maf.low_rank and maf.combination == "literal" and maf.max_lengths == [5, 6, 7]
    assert maf.subsets[-1] == (0, 1, 2) and maf.terms["0_1"].rank == 3 and maf.terms["0"].score_vector.shape == (6,)
    assert maf.query_dim == 256 and maf.out_dim == 9 and decoder.embedding.weight.shape == (9, 128)
    assert decoder.lstm.input_size == 128 and decoder.lstm.hidden_size == 256 and decoder.dropout.p == 0.0
    assert decoder.initial_hidden.in_features == 9 and decoder.state_output.out_features == 9
    assert decoder.embedding.padding_idx == 4 and bool((decoder.embedding.weight[4] == 0).all())
    default = CaptionDecoder([3, 2], 5)
    assert default.maf.subsets == [(0,), (1,), (0, 1)] and not default.maf.low_rank
    assert default.maf.combination == "log" and default.padding_index == 0
    assert default.maf.terms["0_1"].mapping.query_projections[0].out_features == 64
    for kwargs, message in (
        ({"vocab_size": 1}, r"^CaptionDecoder: vocab_size must be >= 2 and sizes positive, got vocab_size=1, "
                            r"embed_dim=128, hidden_dim=256$"),
        ({"embed_dim": 0}, r"embed_dim=0, hidden_dim=256$"),
        ({"hidden_dim": 0}, r"hidden_dim=0$"),
        ({"padding_index": -1}, r"^CaptionDecoder: padding_index -1 is not a token id in \[0, 4\]$"),
        ({"padding_index": 5}, r"^CaptionDecoder: padding_index 5 is not a token id in \[0, 4\]$"),
    ):
        with pytest.raises(ValueError, match=message):
            CaptionDecoder(**{"input_dims": [3, 2], "vocab_size": 5, **kwargs})


def test_token_and_greedy_errors_name_what_is_wrong():
    decoder = make_decoder()
    inputs, masks = make_inputs()
    with pytest.raises(ValueError, match=r"^CaptionDecoder: captions must be a LongTensor of token ids$"):
        decoder([[1, 2]] * 3, inputs, masks)
    with pytest.raises(ValueError, match=r"^CaptionDecoder: captions holds token ids outside \[0, 6\] \(min -1, max 2\)$"):
        decoder(torch.tensor([[1, 2], [1, -1], [1, 2]]), inputs, masks)
    with pytest.raises(ValueError, match=r"^CaptionDecoder: captions has batch size 2, the features 3$"):
        decoder(torch.tensor([[1, 2], [1, 2]]), inputs, masks)
    with pytest.raises(ValueError, match=r"^CaptionDecoder: captions has shape \(3, 1\); expected \(B, L\) with L >= 2"):
        decoder(torch.tensor([[1], [1], [1]]), inputs, masks)
    with pytest.raises(ValueError, match=r"^CaptionDecoder: captions has shape \(3,\); expected"):
        decoder(torch.tensor([1, 1, 1]), inputs, masks)
    with pytest.raises(ValueError, match=r"^CaptionDecoder: modality 1 has feature size 3"):
        decoder(torch.tensor([[1, 2]] * 3), [inputs[0], inputs[0]], None)
    with pytest.raises(ValueError, match=r"^CaptionDecoder: max_length must be >= 1, got 0$"):
        decoder.greedy(inputs, masks, begin_index=1, end_index=2, max_length=0)
    for name, bad in (("begin_index", {"begin_index": 7, "end_index": 2}),
                      ("begin_index", {"begin_index": -1, "end_index": 2}),
                      ("end_index", {"begin_index": 1, "end_index": 7})):
        with pytest.raises(ValueError, match=rf"^CaptionDecoder: {name} -?\d is not a token id$"):
            decoder.greedy(inputs, masks, **bad)


def test_greedy_runs_to_max_length_without_an_end_and_never_emits_begin_or_padding():
    decoder = make_decoder()
    with torch.no_grad():  # padding (0) and begin (3) are the most probable words
        decoder.state_output.bias.copy_(torch.tensor([50.0, 0, 0, 40.0, 0, 0, 0], dtype=F64))
    inputs, masks = make_inputs(seed=6)
    tokens, steps = decoder.greedy(inputs, masks, begin_index=3, end_index=6)  # default max_length 20
    for b in range(3):
        xs, real = sample(inputs, masks, b)
        hidden, cell = reference_initial_state(decoder, xs, real)
        word, expected = 3, []
        for _ in range(20):
            logits, hidden, cell, _ = reference_step(decoder, word, hidden, cell, xs, real)
            logits[[0, 3]] = -math.inf
            word = int(logits.argmax())
            expected.append(word)
            if word == 6:
                break
        assert [t for t in tokens[b].tolist() if t != 0] == expected
    assert tokens.shape[1] == len(steps) and len(steps) <= 20 and bool((tokens != 3).all())


def test_caption_cross_entropy_ignores_the_given_padding_index_and_checks_shapes():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 3, VOCAB, generator=gen, dtype=F64)
    targets = torch.tensor([[4, 2, 3], [3, 0, 3]])  # padding index 3
    terms = [-torch.log_softmax(logits[b, t], -1)[targets[b, t]] for b in range(2) for t in range(3)
             if targets[b, t] != 3]
    got = caption_cross_entropy(logits, targets, padding_index=3)
    assert abs(float(got) - float(sum(terms) / len(terms))) < 1e-12
    with pytest.raises(ValueError, match=r"^caption_cross_entropy: logits \(2, 3, 7\) and targets \(2, 2\) must be"):
        caption_cross_entropy(logits, targets[:, :2])
    with pytest.raises(ValueError, match=r"^caption_cross_entropy: logits \(6, 7\) and targets \(6,\) must be"):
        caption_cross_entropy(logits.flatten(0, 1), targets.flatten())
    with pytest.raises(ValueError, match=r"^caption_cross_entropy: label_smoothing must lie in \[0, 1\), got -0.1$"):
        caption_cross_entropy(logits, targets, label_smoothing=-0.1)


def test_mean_pool_context_reports_the_masked_means_as_context():
    # MAFOutput.context of the baseline: the masked mean of each modality (Eq. 5 with
    # uniform attention), computed here by loops.
    decoder = CaptionDecoder(DIMS, VOCAB, embed_dim=4, hidden_dim=5, orders=None).double()
    inputs, masks = make_inputs(seed=6)
    out = decoder.maf.fuse_prepared(torch.zeros(3, 5, dtype=F64), inputs, masks)  # query unused
    for x, m, got in zip(inputs, masks, out.context, strict=True):
        for b in range(x.shape[0]):
            rows = [x[b, t] for t in range(x.shape[1]) if m[b, t]]
            torch.testing.assert_close(got[b], sum(rows) / len(rows), rtol=0, atol=1e-12)


def test_decoder_defaults_and_smallest_sizes():
    default = CaptionDecoder([3, 2, 4], 5)  # orders "UB": unary and binary terms, no ternary
    assert default.maf.subsets == [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2)]
    assert CaptionDecoder([3, 2], 5, low_rank=True).maf.terms["0_1"].rank == 1  # default rank
    tiny = CaptionDecoder([3, 2], 2, embed_dim=1, hidden_dim=1)  # the smallest valid sizes
    assert tiny.embedding.weight.shape == (2, 1) and tiny.lstm.hidden_size == 1
    decoder = make_decoder()
    inputs, masks = make_inputs()
    assert decoder(torch.tensor([[1, 2]] * 3), inputs, masks).shape == (3, 1, VOCAB)  # L = 2: one step
    with pytest.raises(ValueError, match=r"^CaptionDecoder: captions has batch size 2, the features 3$"):
        decoder(torch.tensor([[1, 2, 3], [1, 2, 3]]), inputs, masks)
