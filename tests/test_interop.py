"""load_ban_fusion (interop) against a small re-implementation of the reference BanModel's structure.

The oracle below is written for this test from the semantics of github.com/jnhwkim/ban-vqa
(FCNet, BCNet, BiAttention and the glimpse loop of BanModel.forward without the
counting module), with the same parameter names, so that its ``state_dict()`` has
the reference's keys: old-style ``torch.nn.utils.weight_norm`` (``weight_g``,
``weight_v``) over the whole matrix (``dim=None``), ``main.<i>`` indices that count
the dropout layers, ``h_mat``/``h_bias`` of shape (1, G, 1, K') and (1, G, 1, 1).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from tests.helpers.ban_vqa import ANSWERS, EMBEDDING_DIM, HIDDEN, IMAGE_DIM, WORDS, ban_vqa_state
from torch import nn

from polyfuse.interop import load_ban_fusion as load_ban_vqa
from polyfuse.interop import load_ban_vqa as load_whole_ban_vqa


def _old_weight_norm(module: nn.Module, name: str = "weight") -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated, still what the reference used
        return torch.nn.utils.weight_norm(module, name=name, dim=None)


class OracleFCNet(nn.Module):
    """[Dropout] -> weight-normed Linear -> [ReLU], in a Sequential called ``main``."""

    def __init__(self, in_dim: int, out_dim: int, activation: bool = True, dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Dropout(dropout)] if dropout > 0 else []
        layers.append(_old_weight_norm(nn.Linear(in_dim, out_dim)))
        if activation:
            layers.append(nn.ReLU())
        self.main = nn.Sequential(*layers)

    def forward(self, x):
        return self.main(x)


class OracleBCNet(nn.Module):
    """Low-rank bilinear connection: h_out maps (h_out <= 32) or weighted pooling (h_out None)."""

    def __init__(self, v_dim, q_dim, h_dim, h_out, k, fc_dropout=0.2, attention_dropout=0.5):
        super().__init__()
        self.k, self.h_out = k, h_out
        self.v_net = OracleFCNet(v_dim, h_dim * k, dropout=fc_dropout)
        self.q_net = OracleFCNet(q_dim, h_dim * k, dropout=fc_dropout)
        self.dropout = nn.Dropout(attention_dropout)
        if h_out is not None:
            self.h_mat = nn.Parameter(torch.randn(1, h_out, 1, h_dim * k))
            self.h_bias = nn.Parameter(torch.randn(1, h_out, 1, 1))

    def forward(self, v, q):  # (B, G, T_v, T_q) logits
        v_features = self.dropout(self.v_net(v))
        q_features = self.q_net(q)
        return torch.einsum("xhyk,bvk,bqk->bhvq", self.h_mat, v_features, q_features) + self.h_bias

    def forward_with_weights(self, v, q, weights):  # (B, h_dim)
        pooled = torch.einsum("bvk,bvq,bqk->bk", self.v_net(v), weights, self.q_net(q))
        if self.k > 1:
            pooled = (
                nn.functional.avg_pool1d(pooled.unsqueeze(1), self.k, self.k).squeeze(1) * self.k
            )
        return pooled


class OracleBiAttention(nn.Module):
    def __init__(self, x_dim, y_dim, z_dim, glimpses):
        super().__init__()
        self.glimpses = glimpses
        self.logits = _old_weight_norm(OracleBCNet(x_dim, y_dim, z_dim, glimpses, k=3), "h_mat")

    def forward_all(self, v, q):
        logits = self.logits(v, q)
        empty_rows = (v.abs().sum(2) == 0)[:, None, :, None].expand(logits.shape)
        logits = logits.masked_fill(empty_rows, float("-inf"))  # the reference masks zero rows of v
        batch, _, v_num, q_num = logits.shape
        attention = logits.reshape(batch, self.glimpses, v_num * q_num).softmax(2)
        return attention.reshape(logits.shape), logits


class OracleBanModel(nn.Module):
    def __init__(self, v_dim, q_dim, hidden, glimpses, *, attention_hidden=None, joint_k=1):
        super().__init__()
        self.glimpses = glimpses
        self.w_emb = nn.Embedding(11, 3)  # stands for the keys load_ban_vqa must ignore
        self.v_att = OracleBiAttention(v_dim, q_dim, attention_hidden or hidden, glimpses)
        self.b_net = nn.ModuleList(
            OracleBCNet(v_dim, q_dim, hidden, None, k=joint_k) for _ in range(glimpses)
        )
        self.q_prj = nn.ModuleList(
            OracleFCNet(hidden, q_dim, activation=False, dropout=0.2) for _ in range(glimpses)
        )
        self.c_prj = nn.ModuleList(OracleFCNet(11, q_dim) for _ in range(glimpses))
        self.classifier = nn.Linear(q_dim, 7)

    def forward(self, v, q_emb):
        attention, _ = self.v_att.forward_all(v, q_emb)
        for glimpse in range(self.glimpses):
            joint = self.b_net[glimpse].forward_with_weights(v, q_emb, attention[:, glimpse])
            q_emb = self.q_prj[glimpse](joint.unsqueeze(1)) + q_emb
        return q_emb.sum(1)  # what the classifier sees


V_DIM, Q_DIM = 7, 5


def _oracle(glimpses, seed=0, **options):
    torch.manual_seed(seed)
    oracle = OracleBanModel(V_DIM, Q_DIM, 4, glimpses, **options).eval()
    with torch.no_grad():  # norms that differ from |v|, so that g is really used
        for name, parameter in oracle.named_parameters():
            if name.endswith("_g"):
                parameter.uniform_(0.5, 2.0)
    return oracle


def _batch(seed=1):
    generator = torch.Generator().manual_seed(seed)
    v = torch.randn(3, 6, V_DIM, generator=generator)
    v[0, 4:] = 0  # padded image regions: all-zero rows, as the reference expects
    v[2, 1:] = 0
    q_emb = torch.randn(3, 4, Q_DIM, generator=generator)
    return v, q_emb, v.abs().sum(2) != 0


@pytest.mark.parametrize(
    ("glimpses", "options"),
    [(1, {}), (2, {}), (3, {"attention_hidden": 2, "joint_k": 3})],
)
def test_matches_reference_structure(glimpses, options):
    oracle = _oracle(glimpses, **options)
    v, q_emb, v_mask = _batch()
    ban = load_ban_vqa(oracle.state_dict()).eval()
    assert ban.glimpses == glimpses and ban.input_dims == [V_DIM, Q_DIM] and ban.out_dim == Q_DIM
    assert ban.joint_pool == options.get("joint_k", 1)
    assert ban.attention_rank == 3 * options.get("attention_hidden", 4)
    with torch.no_grad():
        expected = oracle(v, q_emb)
        torch.testing.assert_close(
            ban([v, q_emb], masks=[v_mask, None]), expected, rtol=1e-5, atol=1e-5
        )
        # Same attention maps as the reference (its h_bias cancels in the softmax).
        reference_maps, _ = oracle.v_att.forward_all(v, q_emb)
        x_mask = v_mask
        y_mask = torch.ones(q_emb.shape[:2], dtype=torch.bool)
        maps = ban.attention_maps(v, q_emb, x_mask, y_mask)
        torch.testing.assert_close(maps, reference_maps, rtol=1e-5, atol=1e-6)


def test_float64_checkpoint_wrapper_prefix_and_fewer_glimpses():
    oracle = _oracle(3).double()
    v, q_emb, v_mask = _batch()
    v, q_emb = v.double(), q_emb.double()
    wrapped = {"model_state": {f"module.{k}": t for k, t in oracle.state_dict().items()}}
    ban = load_ban_vqa(wrapped).eval()
    assert next(ban.parameters()).dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(ban([v, q_emb], masks=[v_mask, None]), oracle(v, q_emb))
        # A prefix of the chain: the first two glimpses, with the reference's first two maps.
        fewer = load_ban_vqa(wrapped, glimpses=2).eval()
        assert fewer.glimpses == 2
        reference_maps, _ = oracle.v_att.forward_all(v, q_emb)
        expected = q_emb
        for glimpse in range(2):
            joint = oracle.b_net[glimpse].forward_with_weights(
                v, expected, reference_maps[:, glimpse]
            )
            expected = oracle.q_prj[glimpse](joint.unsqueeze(1)) + expected
        torch.testing.assert_close(fewer([v, q_emb], masks=[v_mask, None]), expected.sum(1))


def test_missing_keys_are_reported():
    state = _oracle(2).state_dict()
    for key in [k for k in state if k.startswith("b_net.1.q_net.")]:
        del state[key]
    with pytest.raises(ValueError, match=r"missing keys b_net\.1\.q_net\.main\.<i>"):
        load_ban_vqa(state)
    state = _oracle(2).state_dict()
    del state["v_att.logits.h_mat_v"]
    with pytest.raises(ValueError, match=r"missing key v_att\.logits\.h_mat_v"):
        load_ban_vqa(state)
    del state["v_att.logits.h_mat_g"]
    with pytest.raises(ValueError, match=r"missing keys v_att\.logits\.h_mat_g and v_att\.logits\.h_mat_v"):
        load_ban_vqa(state)
    for key in ["q_prj.1.main.1.bias", "v_att.logits.q_net.main.1.bias", "b_net.0.v_net.main.1.weight_v"]:
        state = _oracle(2).state_dict()  # a bias is no longer taken as zero when absent
        del state[key]
        with pytest.raises(ValueError, match=rf"missing key {re.escape(key)}"):
            load_ban_vqa(state)
    state = _oracle(2).state_dict()
    del state["q_prj.0.main.1.weight_g"]
    with pytest.raises(ValueError, match=r"missing key q_prj\.0\.main\.1\.weight_g"):
        load_ban_vqa(state)
    with pytest.raises(ValueError, match=r"no key starts with 'v_att\.'"):
        load_ban_vqa({"w_emb.weight": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="glimpses=3, but the state dict holds 2"):
        load_ban_vqa(_oracle(2).state_dict(), glimpses=3)


def test_inconsistent_shapes_are_reported():
    state = _oracle(2).state_dict()
    state["b_net.1.v_net.main.1.weight_v"] = torch.randn(4, V_DIM + 1)
    with pytest.raises(ValueError, match=r"the input size of b_net\.1\.v_net is 8, expected 7"):
        load_ban_vqa(state)
    state = _oracle(2).state_dict()
    state["v_att.logits.h_mat_v"] = torch.randn(1, 2, 1, 5)
    with pytest.raises(ValueError, match=r"last size of v_att\.logits\.h_mat_v is 5, expected 12"):
        load_ban_vqa(state)
    state = _oracle(2).state_dict()
    state["q_prj.0.main.1.weight_v"] = torch.randn(Q_DIM + 1, 4)
    state["q_prj.0.main.1.bias"] = torch.randn(Q_DIM + 1)
    with pytest.raises(ValueError, match=r"the output size of q_prj\.0 is 6, expected 5"):
        load_ban_vqa(state)
    state = _oracle(2).state_dict()
    state["b_net.0.q_net.main.1.bias"] = torch.randn(3)
    with pytest.raises(ValueError, match=r"b_net\.0\.q_net\.main\.1\.bias has shape \(3,\)"):
        load_ban_vqa(state)


@pytest.mark.parametrize(("fc_dropout", "attention_dropout"), [(0.0, 0.5), (0.2, 0.0)])
def test_training_dropout_sits_where_the_reference_puts_it(fc_dropout, attention_dropout):
    """In training, with the same random stream, polyfuse drops the same tensors as the
    reference: the attention dropout on relu(U^T x) of the image side (BCNet.forward:
    ``self.dropout(self.v_net(v))``), and the FCNet dropout before every linear map
    (v_net, q_net, q_prj). One kind at a time, so that both draw in the same order."""
    oracle = _oracle(2).double().train()
    for name, module in oracle.named_modules():
        if isinstance(module, nn.Dropout):
            module.p = attention_dropout if name.endswith("logits.dropout") else fc_dropout
    v, q_emb, v_mask = _batch(seed=4)
    v, q_emb = v.double(), q_emb.double()
    ban = load_ban_vqa(oracle.state_dict()).double().train()
    ban.dropout, ban.attention_dropout = fc_dropout, attention_dropout
    with torch.no_grad():
        torch.manual_seed(5)
        expected = oracle(v, q_emb)
        torch.manual_seed(5)
        actual = ban([v, q_emb], masks=[v_mask, None])
        torch.manual_seed(5)
        without = ban.eval()([v, q_emb], masks=[v_mask, None])
    torch.testing.assert_close(actual, expected)
    assert not torch.allclose(actual, without)  # the dropout really changed the output


# ---------------------------------------------------------------------------------------
# load_ban_vqa: a whole BanModel state dict, built here with the keys and shapes that
# ban-vqa's build_ban(dataset, num_hid, op, gamma) gives (tests/helpers/ban_vqa.py, checked
# against the reference code itself in tests/nn/test_ban_vqa_reference.py when it is given).

def _vqa_batch(seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    v = torch.randn(2, 12, IMAGE_DIM, generator=generator)
    v[1, -3:] = 0.0  # padding objects
    corners = torch.rand(2, 12, 2, generator=generator)
    boxes = torch.cat([corners, corners + 0.05 + 0.4 * torch.rand(2, 12, 2, generator=generator)], dim=-1)
    q = torch.randint(0, WORDS + 1, (2, 6), generator=generator)  # index WORDS is padding
    q[0, -2:] = WORDS
    return q, v, boxes


def test_op_c_layout_loads_with_both_embeddings():
    """ban-vqa's default --op c: the GRU reads cat(emb(x), emb_(x)) (language_model.py,
    WordEmbedding.forward). Oracle 1: nn.GRU run on that concatenation, built from the
    stored tensors. Oracle 2, whole model: the same file with the two embeddings joined
    into one (V + 1, 2E) table, loaded through the single-embedding path (itself checked
    against the reference code), gives the same logits and attention."""
    state = ban_vqa_state(op_c=True)
    model = load_whole_ban_vqa(state).eval()
    assert model.question.second_embedding is not None
    assert model.question.gru.input_size == 2 * EMBEDDING_DIM
    q, v, boxes = _vqa_batch()
    gru = nn.GRU(2 * EMBEDDING_DIM, HIDDEN, batch_first=True)
    gru.load_state_dict({k.removeprefix("q_emb.rnn."): t for k, t in state.items() if k.startswith("q_emb.rnn.")})
    words = torch.cat([state["w_emb.emb.weight"][q], state["w_emb.emb_.weight"][q]], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(model.question(q), gru(words)[0])
        logits, attention = model(q, v, boxes)

    joined = dict(state)
    joined["w_emb.emb.weight"] = torch.cat([joined.pop("w_emb.emb.weight"), joined.pop("w_emb.emb_.weight")], dim=1)
    single = load_whole_ban_vqa(joined).eval()
    assert single.question.second_embedding is None
    with torch.no_grad():
        expected_logits, expected_attention = single(q, v, boxes)
    torch.testing.assert_close(attention, expected_attention)
    torch.testing.assert_close(logits, expected_logits)
    # the second embedding matters: zeroing it changes the answer logits
    with torch.no_grad():
        model.question.second_embedding.weight.zero_()
        assert (model(q, v, boxes)[0] - expected_logits).abs().max() > 1e-3


def test_single_embedding_layout_still_loads():
    model = load_whole_ban_vqa(ban_vqa_state(op_c=False))
    assert model.question.second_embedding is None
    assert "question.second_embedding.weight" not in model.state_dict()
    assert model.question.gru.input_size == EMBEDDING_DIM


_NEEDED_KEYS = [
    (op_c, key)
    for op_c in (True, False)
    for key in ban_vqa_state(op_c=op_c)
    if not re.fullmatch(r"counter\.f\.(8|9|1\d)\.weight", key)
]


@pytest.mark.parametrize(("op_c", "key"), _NEEDED_KEYS)
def test_each_missing_key_is_named(op_c, key):
    """Every key the model needs, removed in turn, fails the load with its name (a missing
    FCNet bias used to load as zeros, and a missing emb_ gave only a GRU shape error)."""
    state = ban_vqa_state(op_c=op_c)
    del state[key]
    with pytest.raises(ValueError, match=rf"missing key.*{re.escape(key)}"):
        load_whole_ban_vqa(state)


def test_unused_counter_functions_may_be_absent_and_extra_keys_are_named():
    state = ban_vqa_state()
    for k in range(8, 16):  # built by the reference, never used by its forward
        del state[f"counter.f.{k}.weight"]
    load_whole_ban_vqa(state)
    state["w_emb.emb2.weight"] = torch.zeros(WORDS + 1, 3)
    state["q_prj.0.main.2.bias"] = torch.zeros(HIDDEN)
    with pytest.raises(ValueError, match=r"q_prj\.0\.main"):  # a second layer under q_prj.0
        load_whole_ban_vqa(state)
    del state["q_prj.0.main.2.bias"]
    with pytest.raises(ValueError, match=r"no part of BanVQA uses: \['w_emb\.emb2\.weight'\]"):
        load_whole_ban_vqa(state)


def _logits(model, batch=None):
    q, v, boxes = batch or _vqa_batch()
    with torch.no_grad():
        return model.eval()(q, v.to(next(model.parameters()).dtype), boxes)[0]


def _fcnet_stems(state):
    return sorted({k.rsplit(".", 1)[0] for k in state if k.endswith(".weight_v") and not k.startswith("classifier.")})


def test_other_weight_forms_give_the_same_model():
    """The same weights stored as a plain ``weight`` (no weight norm), as parametrization
    keys, or with a weight norm per row (old ``weight_norm(dim=0)``: g (out, 1)) load to
    the same logits; the attention's p_g also as a plain ``h_mat``."""
    state = ban_vqa_state()
    expected = _logits(load_whole_ban_vqa(state))

    def effective(g, v):  # weight = g v / ||v||_F
        return g * v / v.norm()

    plain, parametrized, per_row = dict(state), dict(state), dict(state)
    for stem in [*_fcnet_stems(state), "classifier.main.0", "classifier.main.3"]:
        g, v = state[f"{stem}.weight_g"], state[f"{stem}.weight_v"]
        for form in (plain, parametrized, per_row):
            del form[f"{stem}.weight_g"], form[f"{stem}.weight_v"]
        plain[f"{stem}.weight"] = effective(g, v)
        if stem.startswith("classifier."):  # the classifier takes weight_g/v or weight only
            parametrized[f"{stem}.weight"] = per_row[f"{stem}.weight"] = effective(g, v)
            continue
        parametrized[f"{stem}.parametrizations.weight.original0"] = g
        parametrized[f"{stem}.parametrizations.weight.original1"] = v
        # rows of norm g_i: g_i = ||row_i|| of the effective weight, v any multiple of it
        weight = effective(g, v)
        per_row[f"{stem}.weight_g"] = weight.norm(dim=1, keepdim=True)
        per_row[f"{stem}.weight_v"] = 3.0 * weight
    plain["v_att.logits.h_mat"] = effective(plain.pop("v_att.logits.h_mat_g"), plain.pop("v_att.logits.h_mat_v"))
    for form in (plain, parametrized, per_row):
        torch.testing.assert_close(_logits(load_whole_ban_vqa(form)), expected)


def test_without_counter_and_with_one_glimpse():
    """No counter. and c_prj. keys: BAN without counter, whose logits are the full
    model's with its counter switched off; half of the counter is an error naming the rest."""
    state = ban_vqa_state()
    full = load_whole_ban_vqa(state)
    full.counter = None  # forward then skips the counter and the count projections
    expected = _logits(full)
    bare = {k: t for k, t in state.items() if not k.startswith(("counter.", "c_prj."))}
    model = load_whole_ban_vqa(bare)
    assert model.counter is None and model.count_projections is None
    torch.testing.assert_close(_logits(model), expected)
    with pytest.raises(ValueError, match=r"missing keys c_prj\.0\.main\.<i>"):
        load_whole_ban_vqa({k: t for k, t in state.items() if not k.startswith("c_prj.")})
    with pytest.raises(ValueError, match=r"missing key counter\.f\.0\.weight"):
        load_whole_ban_vqa({k: t for k, t in state.items() if not k.startswith("counter.")})
    one = load_whole_ban_vqa(ban_vqa_state(glimpses=1))
    assert one.glimpses == 1 and one.counter is not None and len(one.count_projections) == 1


def test_float64_prefix_and_classifier_width():
    state = ban_vqa_state()
    expected = _logits(load_whole_ban_vqa(state)).double()
    double = load_whole_ban_vqa({f"net.{k}": t.double() for k, t in state.items()}, prefix="net.")
    assert next(double.parameters()).dtype == torch.float64
    torch.testing.assert_close(_logits(double), expected)
    # a classifier of width 3H instead of 2H: oracle from the stored tensors
    wide = dict(state)
    wide["classifier.main.0.weight_v"] = torch.randn(3 * HIDDEN, HIDDEN)
    wide["classifier.main.0.bias"] = torch.randn(3 * HIDDEN)
    wide["classifier.main.3.weight_v"] = torch.randn(ANSWERS, 3 * HIDDEN)
    model = load_whole_ban_vqa(wide).eval()
    x = torch.randn(4, HIDDEN)

    def layer(index, inputs):
        g, v, b = (wide[f"classifier.main.{index}.{name}"] for name in ("weight_g", "weight_v", "bias"))
        return inputs @ (g * v / v.norm()).T + b

    with torch.no_grad():
        torch.testing.assert_close(model.classifier(x), layer(3, torch.relu(layer(0, x))))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("v_att.logits.h_bias", torch.zeros(1, 3, 1, 1), r"v_att\.logits\.h_bias has shape \(1, 3, 1, 1\), expected \(1, 2, 1, 1\)"),
        ("q_emb.rnn.bias_hh_l0", torch.zeros(5), r"q_emb\.rnn\.bias_hh_l0 has shape \(5,\), expected \(18,\) \(question GRU\)"),
        ("q_emb.rnn.weight_ih_l0", torch.zeros(18, 4), r"q_emb\.rnn\.weight_ih_l0 has shape \(18, 4\), expected \(18, 8\)"),
        ("classifier.main.3.bias", torch.zeros(4), r"classifier\.main\.3\.bias has shape \(4,\), expected \(5,\) \(the answer classifier\)"),
        ("classifier.main.0.weight_v", torch.zeros(12, 5), r"classifier\.main\.0 is \(12, 5\) and classifier\.main\.3 is \(5, 12\) for hidden size 6"),
        ("classifier.main.3.weight_v", torch.zeros(5, 11), r"classifier\.main\.0 is \(12, 6\) and classifier\.main\.3 is \(5, 11\) for hidden size 6"),
        ("w_emb.emb_.weight", torch.zeros(WORDS, 4), r"w_emb\.emb_\.weight has shape \(9, 4\); expected \(10, E2\)"),
        ("q_prj.1.main.1.weight_v", torch.ones(6, 6, 1), r"q_prj\.1\.main\.1\.weight_v has shape \(6, 6, 1\); expected 2-d \(P of glimpse 1\)"),
        ("q_prj.1.main.1.weight_g", torch.ones(4, 1), r"q_prj\.1\.main\.1\.weight_g has shape \(4, 1\), which does not fit weight_v of shape \(6, 6\)"),
    ],
)
def test_inconsistent_shapes_of_the_whole_model(key, value, message):
    state = ban_vqa_state()
    state[key] = value
    with pytest.raises(ValueError, match=message):
        load_whole_ban_vqa(state)
