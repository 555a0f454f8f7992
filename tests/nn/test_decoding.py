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
