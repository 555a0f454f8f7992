"""A whole BanModel state dict of jnhwkim/ban-vqa (task vqa), random tensors with the keys
and shapes that its ``build_ban(dataset, num_hid, op, gamma)`` gives: checked against the
reference code itself in tests/nn/test_ban_vqa_reference.py when that is given."""

from __future__ import annotations

import torch

#: the default sizes: V words, H hidden, A answers, d_v image features, E embedding
WORDS, HIDDEN, ANSWERS, IMAGE_DIM, EMBEDDING_DIM = 9, 6, 5, 7, 4


def ban_vqa_state(
    *, op_c: bool = True, glimpses: int = 2, seed: int = 0, words: int = WORDS, hidden: int = HIDDEN,
    answers: int = ANSWERS, image_dim: int = IMAGE_DIM, embedding_dim: int = EMBEDDING_DIM,
) -> dict[str, torch.Tensor]:
    """Random tensors in the layout of ban-vqa's BanModel for task vqa: FCNets with
    dropout have their linear layer at ``main.1``, those without (c_prj) at ``main.0``;
    old weight norm over the whole matrix (a 0-d ``weight_g``); the counter of 10 objects
    with 16 functions of 17 values, f.8 to f.15 at their initial [0, 1, ..., 1]; with
    ``op_c`` the second embedding ``w_emb.emb_`` and a GRU of 2 E inputs. Sizes: V
    ``words``, H ``hidden``, A ``answers``, d_v ``image_dim``, E ``embedding_dim``."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return 0.5 * torch.randn(shape, generator=generator)

    def norm_scale() -> torch.Tensor:
        return torch.rand((), generator=generator) + 0.5

    state = {"w_emb.emb.weight": rand(words + 1, embedding_dim)}
    if op_c:
        state["w_emb.emb_.weight"] = rand(words + 1, embedding_dim)
    gru_inputs = embedding_dim * (2 if op_c else 1)
    state["q_emb.rnn.weight_ih_l0"] = rand(3 * hidden, gru_inputs)
    state["q_emb.rnn.weight_hh_l0"] = rand(3 * hidden, hidden)
    state["q_emb.rnn.bias_ih_l0"] = rand(3 * hidden)
    state["q_emb.rnn.bias_hh_l0"] = rand(3 * hidden)

    def linear(stem: str, out_dim: int, in_dim: int) -> None:
        state[f"{stem}.bias"] = rand(out_dim)
        state[f"{stem}.weight_g"] = norm_scale()
        state[f"{stem}.weight_v"] = rand(out_dim, in_dim)

    state["v_att.logits.h_bias"] = rand(1, glimpses, 1, 1)
    state["v_att.logits.h_mat_g"] = norm_scale()
    state["v_att.logits.h_mat_v"] = rand(1, glimpses, 1, 3 * hidden)
    linear("v_att.logits.v_net.main.1", 3 * hidden, image_dim)
    linear("v_att.logits.q_net.main.1", 3 * hidden, hidden)
    for g in range(glimpses):
        linear(f"b_net.{g}.v_net.main.1", hidden, image_dim)
        linear(f"b_net.{g}.q_net.main.1", hidden, hidden)
    for g in range(glimpses):
        linear(f"q_prj.{g}.main.1", hidden, hidden)
    for g in range(glimpses):
        linear(f"c_prj.{g}.main.0", hidden, 11)
    linear("classifier.main.0", 2 * hidden, hidden)
    linear("classifier.main.3", answers, 2 * hidden)
    for k in range(16):
        function = torch.ones(17) if k >= 8 else torch.rand(17, generator=generator) + 0.1
        function[0] = 0.0
        state[f"counter.f.{k}.weight"] = function
    return state
