"""polyfuse.nn.BAN: the interface, masks on both inputs and the residual glimpse chain."""

from __future__ import annotations

import pytest
import torch

from polyfuse.nn import BAN, create

X_DIM, Y_DIM = 6, 5


def _inputs(batch=3, length_x=4, length_y=5, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length_x, X_DIM, generator=generator).to(dtype)
    y = torch.randn(batch, length_y, Y_DIM, generator=generator).to(dtype)
    x_mask = torch.ones(batch, length_x, dtype=torch.bool)
    y_mask = torch.ones(batch, length_y, dtype=torch.bool)
    x_mask[1, 2:] = False
    y_mask[1, 3:] = False
    y_mask[2, 1:] = False
    return x, y, x_mask, y_mask


def _model(out_dim=Y_DIM, **options):
    torch.manual_seed(0)
    return BAN([X_DIM, Y_DIM], out_dim, **{"glimpses": 3, **options}).eval()


def _ban_by_loops(model, x, y, x_mask, y_mask):
    """BAN (note 8 of the papers' README, in the reference code's layout) one sample,
    glimpse and pair at a time: logits p_g^T (relu(U x_i + u) o relu(V y_j + v)) over real
    pairs, one softmax per glimpse over the whole map, f'_g = sum_ij A_ij relu(U'_g x_i +
    u'_g) o relu(V'_g y_j + v'_g) on the current y, y <- y + P_g f'_g on every token, then
    the sum over y's real tokens (and the output projection when there is one)."""
    def relu_map(linear, vector):
        return torch.relu(linear.weight @ vector + linear.bias)

    outputs = []
    for b in range(x.shape[0]):
        xs = [x[b, i] for i in range(x.shape[1]) if x_mask[b, i]]
        stream = [y[b, j] for j in range(y.shape[1]) if y_mask[b, j]]
        p = model.attention_glimpses.weight
        maps = []
        for g in range(model.glimpses):
            logits = torch.tensor(
                [[float(p[g] @ (relu_map(model.attention_x, xi) * relu_map(model.attention_y, yj))) for yj in stream] for xi in xs]
            )
            maps.append(torch.softmax(logits.flatten(), 0).reshape(logits.shape))
        for g in range(model.glimpses):
            joint = sum(
                maps[g][i, j] * relu_map(model.joint_x[g], xi) * relu_map(model.joint_y[g], yj)
                for i, xi in enumerate(xs)
                for j, yj in enumerate(stream)
            )
            step = model.joint_projections[g].weight @ joint + model.joint_projections[g].bias
            stream = [yj + step for yj in stream]
        fused = sum(stream)
        if model.output_projection is not None:
            fused = model.output_projection.weight @ fused + model.output_projection.bias
        outputs.append(fused)
    return torch.stack(outputs)


@pytest.mark.parametrize("out_dim", [Y_DIM, 7])
def test_output_against_loops_and_registry(out_dim):
    model = create("ban", input_dims=[X_DIM, Y_DIM], out_dim=out_dim, glimpses=2).eval()
    assert isinstance(model, BAN) and model.registry_name == "ban"
    assert (model.output_projection is None) == (out_dim == Y_DIM)
    x, y, x_mask, y_mask = _inputs()
    out = model([x, y], masks=[x_mask, y_mask])
    with torch.no_grad():
        expected = _ban_by_loops(model, x, y, x_mask, y_mask)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model([x[:, 0], y]), model([x[:, :1], y]))  # (B, d): length 1


def test_masks_on_both_inputs():
    model = _model(out_dim=4)
    x, y, x_mask, y_mask = _inputs()
    out = model([x, y], masks=[x_mask, y_mask])
    dirty_x = torch.where(x_mask[..., None], x, torch.full_like(x, 1e4))
    dirty_y = torch.where(y_mask[..., None], y, torch.randn_like(y) * 100)
    torch.testing.assert_close(model([dirty_x, dirty_y], masks=[x_mask, y_mask]), out)
    # A padded sample gives what its unpadded sequences give alone.
    alone = model([x[1:2, :2], y[1:2, :3]])
    torch.testing.assert_close(out[1:2], alone, rtol=1e-5, atol=1e-5)
    # The masks matter: without them the padded steps count.
    assert not torch.allclose(model([x, y])[1], out[1])


def test_exactly_two_modalities():
    with pytest.raises(ValueError, match="exactly 2 modalities"):
        BAN([X_DIM, Y_DIM, 3], 4)
    model = _model()
    x, y, _, _ = _inputs()
    with pytest.raises(ValueError, match="exactly 2 modalities, got 3"):
        model([x, y, y])
    with pytest.raises(ValueError, match="exactly 2 modalities, got 1"):
        model([x])


def test_bad_options():
    with pytest.raises(ValueError, match="glimpses must be a positive integer"):
        BAN([X_DIM, Y_DIM], 4, glimpses=0)
    with pytest.raises(ValueError, match="attention_dropout must lie in"):
        BAN([X_DIM, Y_DIM], 4, attention_dropout=1.0)
    x, y, x_mask, _ = _inputs()
    empty = x_mask.clone()
    empty[0] = False
    with pytest.raises(ValueError, match=r"all padding for sample\(s\) \[0\]"):
        _model()([x, y], masks=[empty, None])


def _hand_written(model, x, y, x_mask, y_mask):
    """The reference's BanModel loop written out with einsum, one glimpse at a time."""
    relu = torch.relu
    x = x.masked_fill(~x_mask[..., None], 0)
    y = y.masked_fill(~y_mask[..., None], 0)
    u = relu(x @ model.attention_x.weight.T + model.attention_x.bias)  # (B, T_x, K')
    v = relu(y @ model.attention_y.weight.T + model.attention_y.bias)  # (B, T_y, K')
    logits = torch.einsum("gk,bik,bjk->bgij", model.attention_glimpses.weight, u, v)
    pairs = x_mask[:, None, :, None] & y_mask[:, None, None, :]
    logits = logits.masked_fill(~pairs, float("-inf"))
    batch, glimpses = logits.shape[:2]
    attention = logits.reshape(batch, glimpses, -1).softmax(-1).reshape(logits.shape)
    stream = y
    for glimpse in range(glimpses):
        joint_x, joint_y = model.joint_x[glimpse], model.joint_y[glimpse]
        a = relu(x @ joint_x.weight.T + joint_x.bias)
        b = relu(stream @ joint_y.weight.T + joint_y.bias)
        joint = torch.einsum("bik,bij,bjk->bk", a, attention[:, glimpse], b)
        joint = joint.reshape(batch, -1, model.joint_pool).sum(-1)  # sum pooling
        projection = model.joint_projections[glimpse]
        stream = stream + (joint @ projection.weight.T + projection.bias)[:, None, :]
    return (stream * y_mask[..., None]).sum(1)


@pytest.mark.parametrize("joint_pool", [1, 2])
def test_residual_glimpse_chain_matches_hand_written_loop(joint_pool):
    model = _model(hidden_dim=4, glimpses=3, joint_pool=joint_pool).double()
    x, y, x_mask, y_mask = _inputs(dtype=torch.float64)
    expected = _hand_written(model, x, y, x_mask, y_mask)
    torch.testing.assert_close(model([x, y], masks=[x_mask, y_mask]), expected)
    # Each glimpse counts: dropping the last one changes the answer.
    model.glimpses = 2
    assert not torch.allclose(model([x, y], masks=[x_mask, y_mask]), expected)


def test_float64_and_gradients_reach_every_parameter():
    model = BAN([X_DIM, Y_DIM], 4, glimpses=2, k=2).double()
    x, y, x_mask, y_mask = _inputs(dtype=torch.float64)
    out = model([x, y], masks=[x_mask, y_mask])
    assert out.dtype == torch.float64
    out.square().sum().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert bool(torch.isfinite(parameter.grad).all()), name
        assert bool(parameter.grad.abs().sum() > 0), name


def test_dropout_only_in_training():
    model = _model()
    x, y, x_mask, y_mask = _inputs()
    evaluated = model([x, y], masks=[x_mask, y_mask])
    torch.testing.assert_close(model([x, y], masks=[x_mask, y_mask]), evaluated)
    model.train()
    assert not torch.allclose(model([x, y], masks=[x_mask, y_mask]), evaluated)
    no_dropout = _model(dropout=0.0, attention_dropout=0.0).train()
    torch.testing.assert_close(no_dropout([x, y], masks=[x_mask, y_mask]), evaluated)


def test_options_defaults_and_their_checks():
    """Defaults of the reference (ban-vqa: gamma 8, k 3, dropout .2 and .5); every option
    refused by name when it is not a positive integer."""
    torch.manual_seed(0)
    model = BAN([X_DIM, Y_DIM], 16)
    assert (model.hidden_dim, model.glimpses, model.attention_rank, model.joint_pool) == (16, 8, 48, 1)
    assert (model.dropout, model.attention_dropout) == (0.2, 0.5)
    assert model.attention_x.weight.shape == (48, X_DIM) and model.attention_y.weight.shape == (48, Y_DIM)
    assert model.attention_glimpses.weight.shape == (8, 48) and model.attention_glimpses.bias is None
    assert len(model.joint_x) == len(model.joint_y) == len(model.joint_projections) == 8
    assert model.joint_x[0].weight.shape == (16, X_DIM) and model.joint_y[7].weight.shape == (16, Y_DIM)
    assert model.joint_projections[3].weight.shape == (Y_DIM, 16)
    assert model.output_projection.weight.shape == (16, Y_DIM)
    # p_g drawn from N(0, 1) as the reference's h_mat (not the default uniform(+-1/sqrt(48)))
    assert 0.85 < float(model.attention_glimpses.weight.detach().std()) < 1.15
    # weight norm over the whole matrix: one scalar gain per linear map
    for linear in [model.attention_x, model.attention_glimpses, model.output_projection]:
        assert linear.parametrizations.weight.original0.shape == ()
    # ... and one per glimpse's matrix of the stacked joint maps: ||weight[g]||_F = weight_g[g]
    for stacked in [model.joint_x, model.joint_y, model.joint_projections]:
        assert stacked.weight_g.shape == (8, 1, 1)
        with torch.no_grad():
            stacked.weight_g.mul_(torch.arange(1.0, 9.0).view(8, 1, 1))
        norms = torch.linalg.vector_norm(stacked.weight.detach(), dim=(1, 2))
        torch.testing.assert_close(norms, stacked.weight_g.detach().flatten())
    assert model.extra_repr() == (
        f"input_dims=[{X_DIM}, {Y_DIM}], out_dim=16, hidden_dim=16, glimpses=8, attention_rank=48, "
        "joint_pool=1, dropout=0.2, attention_dropout=0.5"
    )
    other = BAN([X_DIM, Y_DIM], 4, hidden_dim=3, glimpses=2, k=2, joint_pool=2, dropout=0.1, attention_dropout=0.3)
    assert (other.hidden_dim, other.attention_rank, other.joint_x[1].weight.shape[0]) == (3, 6, 6)
    assert (other.dropout, other.attention_dropout) == (0.1, 0.3)
    assert BAN([X_DIM, Y_DIM], 4, k=2, attention_rank=5).attention_rank == 5
    for name, value in [("hidden_dim", 0), ("glimpses", 0), ("glimpses", 1.5), ("k", 0), ("attention_rank", 0), ("joint_pool", 0)]:
        with pytest.raises(ValueError, match=f"^BAN: {name} must be a positive integer, got {value}$"):
            BAN([X_DIM, Y_DIM], 4, **{name: value})
    with pytest.raises(ValueError, match=r"^BAN: dropout must lie in \[0, 1\), got 1.0$"):
        BAN([X_DIM, Y_DIM], 4, dropout=1.0)
    with pytest.raises(ValueError, match=r"^BAN: attention_dropout must lie in \[0, 1\), got -0.1$"):
        BAN([X_DIM, Y_DIM], 4, attention_dropout=-0.1)


def test_operation_counts_at_the_sizes_of_issue_26(monkeypatch):
    """Operations dispatched by one forward (eval, no_grad) and one forward+backward at the
    sizes of issue 26 (out_dim 8, batch 8, inputs of sizes 300 and 74, lengths 20 and 30,
    random padding) on the batched chain that CUDA takes (forced here): 325 and 1,252
    before the glimpses were batched (main 71d5fea), 151 and 498 with them batched
    (4f01894), 160 and 558 since the stacked weights are split once and the residual takes
    2-d products (issue 40: 2-3x less time and 2 GB less memory at the VQA size). The CPU's
    glimpse loop dispatches more (290 and 835) for less time there. Deterministic; see
    `polyfuse bench ops`."""
    from polyfuse.bench.dispatch import OpsSettings, count_module_operations, ops_inputs

    monkeypatch.setattr("polyfuse.nn.ban.chain_on", lambda device: True)
    settings = OpsSettings()
    torch.manual_seed(0)
    model = create("ban", input_dims=list(settings.dims[:2]), out_dim=settings.out_dim)
    forward, forward_backward = count_module_operations(model, *ops_inputs(settings, 2))
    assert forward.total <= 160
    assert forward_backward.total <= 558
    assert forward.by_name["aten._weight_norm_interface"] == 3  # U'_g, V'_g, P_g: one each


def test_the_glimpse_loop_with_dropout_equals_the_batched_chain_without(monkeypatch):
    """Training with dropout runs the glimpses one by one on the whole stream; with the
    dropout off on CUDA it must give the batched chain's answer (the chain forced here)."""
    monkeypatch.setattr("polyfuse.nn.ban.chain_on", lambda device: True)
    model = _model(out_dim=4, hidden_dim=4, joint_pool=2).double()
    x, y, x_mask, y_mask = _inputs(dtype=torch.float64)
    batched = model([x, y], masks=[x_mask, y_mask], return_details=True)
    model.train()
    model.dropout, model.attention_dropout = 1e-300, 0.0  # the loop's path, drawing no zero
    looped = model([x, y], masks=[x_mask, y_mask], return_details=True)
    torch.testing.assert_close(looped.fused, batched.fused, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(looped.sequences[1], batched.sequences[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(looped.attention, batched.attention, rtol=0, atol=0)


def test_the_cpu_takes_the_glimpse_loop_without_dropout(monkeypatch):
    """In evaluation the CPU runs the glimpse loop (faster there, issue 40), with the same
    answer as the chain; and with gradients too (the loop builds the weights by the fused
    weight norm, without them it scales the products)."""
    from polyfuse.nn import ban as ban_module

    assert not ban_module.chain_on(torch.device("cpu")) and ban_module.chain_on(torch.device("cuda"))
    model = _model(out_dim=4, hidden_dim=4, joint_pool=2).double()
    x, y, x_mask, y_mask = _inputs(dtype=torch.float64)
    calls = []
    loop = ban_module.BAN._glimpse_loop
    monkeypatch.setattr(ban_module.BAN, "_glimpse_loop", lambda *a: calls.append(1) or loop(*a))
    looped = model([x, y], masks=[x_mask, y_mask], return_details=True)
    with torch.no_grad():
        looped_without_grad = model([x, y], masks=[x_mask, y_mask], return_details=True)
    assert len(calls) == 2
    monkeypatch.setattr(ban_module, "chain_on", lambda device: True)
    chained = model([x, y], masks=[x_mask, y_mask], return_details=True)
    assert len(calls) == 2
    for other in (looped, looped_without_grad):
        torch.testing.assert_close(other.fused, chained.fused, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(other.sequences[1], chained.sequences[1], rtol=1e-12, atol=1e-12)
