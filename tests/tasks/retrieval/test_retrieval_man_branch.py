"""MAN's branch in mean+man / gating+man: its own learning rate (``man_lr``)."""

import pytest
import torch

from polyfuse.nn.models.retrieval import RetrievalModel
from polyfuse.tasks.ranking.groups import parameter_groups
from polyfuse.tasks.retrieval.spec import split_man_branch


@pytest.mark.parametrize("fusion", ["mean+man", "gating+man"])
def test_man_lr_moves_exactly_the_man_branch_into_its_own_group(fusion):
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion=fusion, hidden_dim=8)
    groups = split_man_branch(parameter_groups(model, None, None), model, 1e-4)
    names = {id(p): n for n, p in model.named_parameters()}
    rest, branch = ({names[id(p)] for p in g["params"]} for g in groups)
    assert groups[1]["lr"] == 1e-4 and "lr" not in groups[0]
    assert rest | branch == set(names.values()) and not rest & branch  # every parameter once
    assert branch == {n for n in names.values() if n.startswith(("video.fusion.", "video.fused_output.", "video.absent."))}
    assert "text_head.weight" in rest or "text_head.mixture.weight" in rest
    assert split_man_branch(parameter_groups(model, None, None), model, None)[0]["params"] == list(model.parameters())


def test_man_lr_is_refused_without_a_man_branch():
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="man", hidden_dim=8)
    with pytest.raises(ValueError, match="man_lr applies to MAN as a branch"):
        split_man_branch(parameter_groups(model, None, None), model, 1e-4)


def test_man_lr_sets_the_step_of_the_man_branch_only():
    """Adam's first step moves every parameter by about its learning rate: the MAN branch
    by man_lr, the mean of experts by lr."""
    torch.manual_seed(0)
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean+man", hidden_dim=8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.Adam(split_man_branch(parameter_groups(model, None, None), model, 1e-4), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    videos = model.embed_videos([torch.randn(3, 4, 5, generator=g), torch.randn(3, 2, 6, generator=g)],
                                [torch.ones(3, 4, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)],
                                torch.ones(3, 2, dtype=torch.bool))
    (model.embed_texts(torch.randn(3, 5, generator=g)) @ videos.T).diagonal().sum().neg().backward()
    optimizer.step()
    step = {n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()}
    assert step["video.fused_output.1.weight"] == pytest.approx(1e-4, rel=1e-3)
    assert step["video.projections.0.weight"] == pytest.approx(1e-2, rel=1e-3)
