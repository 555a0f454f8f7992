"""What ``plot attention`` shows of a fusion: the attention over the real steps only,
wherever they are (retrieval's experts start with a learned absent step that is real
only when the expert is absent)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polyfuse.nn import BAN, MAN, Concat
from polyfuse.nn.models.retrieval import ExpertVideoEncoder
from polyfuse.tasks.attention_figure import fusion_attention


def _masks(*rows: list[int]) -> list[torch.Tensor]:
    return [torch.tensor([row], dtype=torch.bool) for row in rows]


def test_man_marginals_cover_the_real_steps_wherever_they_are():
    torch.manual_seed(0)
    man = MAN([3, 2], out_dim=4, hidden_dim=8, heads=2, mode="exact").eval()
    inputs = [torch.randn(1, 4, 3), torch.randn(1, 3, 2)]
    masks = _masks([0, 1, 1, 0], [1, 0, 1])  # not prefixes
    shown = fusion_attention(man, inputs, masks, ["a", "b"])
    assert shown["kind"] == "man" and shown["lengths"] == [2, 2]
    for layer in shown["layers"]:
        for weights in layer:
            # each head's marginal over the shown steps is the whole distribution
            assert weights.shape == (2, 2)
            np.testing.assert_allclose(weights.sum(1), 1.0, rtol=1e-5)
    # a masked step moved to the end changes nothing shown but its place
    moved = fusion_attention(man, [inputs[0][:, [1, 2, 0, 3]], inputs[1]], _masks([1, 1, 0, 0], [1, 0, 1]), ["a", "b"])
    np.testing.assert_allclose(moved["layers"][0][0], shown["layers"][0][0], rtol=1e-5)


def test_ban_maps_are_cut_to_the_real_steps():
    torch.manual_seed(0)
    ban = BAN([3, 2], out_dim=4, hidden_dim=6, glimpses=2).eval()
    inputs = [torch.randn(1, 4, 3), torch.randn(1, 3, 2)]
    shown = fusion_attention(ban, inputs, _masks([1, 1, 1, 0], [0, 1, 1]), ["x", "y"])
    assert shown["maps"].shape == (2, 3, 2)
    # each glimpse is a softmax over all (x, y) step pairs: the real ones carry it all
    np.testing.assert_allclose(shown["maps"].sum((1, 2)), 1.0, rtol=1e-5)


def test_a_fusion_without_attention_is_refused_by_name():
    with pytest.raises(ValueError, match="fusion Concat has no attention to plot; MAN and BAN have"):
        fusion_attention(Concat([3, 2], out_dim=4), [torch.randn(1, 2, 3), torch.randn(1, 2, 2)],
                         _masks([1, 1], [1, 1]), ["a", "b"])


def test_retrieval_experts_show_their_steps_or_their_absent_step():
    torch.manual_seed(0)
    encoder = ExpertVideoEncoder([3, 2], embed_dim=4, fusion="man", hidden_dim=8,
                                 fusion_options={"heads": 2, "mode": "exact"}).eval()
    features = [torch.randn(1, 3, 3), torch.randn(1, 2, 2)]
    masks = _masks([1, 1, 0], [1, 1])
    present = torch.tensor([[True, False]])
    inputs, input_masks = encoder.joint_inputs(features, masks, present)
    shown = fusion_attention(encoder.fusion, inputs, input_masks, ["rgb", "audio"])
    rgb, audio = shown["layers"][0]
    assert shown["lengths"] == [2, 1]
    assert rgb.shape == (2, 2)  # the two real steps, not the absent step before them
    np.testing.assert_allclose(rgb.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(audio, 1.0)  # the absent expert: all weight on its absent step


def test_learning_curves_count_epochs_from_one_on_integer_ticks(monkeypatch, tmp_path):
    from polyfuse.figures import curves

    drawn = {}
    monkeypatch.setattr(curves, "save_figure", lambda figure, out, **_: drawn.setdefault("figure", figure))
    epochs = {0: {"train/loss": 1.0, "val/loss": 1.2, "val/acc": 0.5}, 1: {"train/loss": 0.8, "val/loss": 1.1, "val/acc": 0.6}}
    curves.draw_learning_curves(epochs, tmp_path / "c.png", monitor="val/acc")
    loss, accuracy = drawn["figure"].axes
    assert [list(line.get_xdata()) for line in loss.get_lines()] == [[1, 2], [1, 2]]
    assert list(accuracy.get_lines()[0].get_xdata()) == [1, 2]
    drawn["figure"].canvas.draw()
    ticks = [t for t in accuracy.get_xticks() if 1 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_chimera_pair_attention_is_eq_8_over_the_real_positions():
    from types import SimpleNamespace

    from polyfuse.nn.models.chimera import ChimeraRetrievalModel
    from polyfuse.tasks.chimera.figure import pair_attention

    torch.manual_seed(0)
    model = ChimeraRetrievalModel(4, 3, num_topics=0, hyperbolic_dim=2).eval()
    tokens, steps = torch.randn(1, 3, 4), torch.randn(1, 2, 3)
    token_mask, step_mask = _masks([1, 1, 0], [1, 1])
    weights = pair_attention(SimpleNamespace(model=model), tokens, token_mask, steps, step_mask).double()
    # by hand: h = [real tokens; projected steps], q/k = exp_0 of the projections, d = arccosh(-<q, k>_L)
    layer = model.hyperbolic
    with torch.no_grad():
        hidden = torch.cat((tokens[0, :2], model.video_projection(steps[0]))).double()

        def points(projection):
            v = projection(hidden.float()).double()
            r = v.norm(dim=-1, keepdim=True)
            return torch.cat((torch.cosh(r), torch.sinh(r) * v / r), -1)

        q, k = points(layer.query), points(layer.key)
        inner = q[:, :1] * k[:, 0] - q[:, 1:] @ k[:, 1:].T
        expected = torch.sigmoid(-layer.beta.double() * torch.arccosh(inner.clamp_min(1.0)) - layer.offset.double())
    assert weights.shape == (4, 4)
    torch.testing.assert_close(weights, expected, rtol=1e-4, atol=1e-5)


def test_chimera_without_its_hyperbolic_layer_has_no_attention():
    from types import SimpleNamespace

    from polyfuse.nn.models.chimera import ChimeraRetrievalModel
    from polyfuse.tasks.chimera.figure import pair_attention

    model = ChimeraRetrievalModel(4, 3, num_topics=0, hyperbolic_dim=0)
    with pytest.raises(ValueError, match="no hyperbolic layer"):
        pair_attention(SimpleNamespace(model=model), torch.randn(1, 2, 4), *_masks([1, 1]), torch.randn(1, 1, 3),
                       *_masks([1]))


def test_titles_wrap_at_90_between_words_only():
    from polyfuse.tasks.attention_figure import TITLE_WIDTH, sample_title

    assert TITLE_WIDTH == 90
    short = "test sample 0 (row 12): prediction [" + ", ".join(["-0.125"] * 6) + "]"  # 83 characters
    assert len(short) < 90 and sample_title(short) == short
    token = "x" * 120  # longer than a line: kept whole
    hyphens = "-".join(["ab"] * 40)  # 119 characters joined by hyphens: not cut at them
    assert sample_title(f"a {token} b").splitlines() == ["a", token, "b"]
    assert sample_title(hyphens) == hyphens


def test_the_tabular_figure_titles_prediction_and_label_and_marks_the_centre(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import polyfuse.tasks.attention_figure as figure

    torch.manual_seed(0)
    man = MAN([3, 2], out_dim=1, hidden_dim=8, heads=2, mode="exact").eval()
    inputs, masks = [torch.randn(1, 4, 3), torch.randn(1, 3, 2)], _masks([1, 1, 1, 0], [1, 1, 1])
    backbone = SimpleNamespace(encode=lambda x, m: x, fusion_inputs=lambda x, m: (x, m), fusion=man,
                               group_names=lambda: ["a", "b"])

    class Module:  # a tabular task as the figure reads it: its backbone, outputs and predictions
        def eval(self):
            return self

        def __call__(self, batch):
            return None

        def predictions(self, outputs):
            return torch.tensor([0.25])

    module = Module()
    module.backbone = backbone
    drawn = {}
    monkeypatch.setattr("polyfuse.figures.attention.draw_man_attention",
                        lambda attention, out, **options: drawn.update(attention=attention, **options) or out)
    batch = {"inputs": inputs, "masks": masks, "row": torch.tensor([12]), "target": torch.tensor([[1.0, -2.5]]),
             "centre": torch.tensor([2])}
    assert figure.tabular_attention_figure(module, batch, tmp_path / "f.png", split="test", sample=3) == tmp_path / "f.png"
    assert drawn["title"] == "test sample 3 (row 12): prediction 0.25, label [1, -2.5]"
    assert drawn["centre"] == 2 and drawn["attention"]["lengths"] == [3, 3]
    del batch["target"], batch["centre"]  # no label (predict data), not contextual
    figure.tabular_attention_figure(module, batch, tmp_path / "f.png", split="all", sample=0)
    assert drawn["title"] == "all sample 0 (row 12): prediction 0.25" and drawn["centre"] is None
    # BAN's maps, drawn with the same title
    ban = BAN([3, 2], out_dim=1, hidden_dim=6, glimpses=2).eval()
    module.backbone = SimpleNamespace(encode=lambda x, m: x, fusion_inputs=lambda x, m: (x, m), fusion=ban,
                                      group_names=lambda: ["a", "b"])
    monkeypatch.setattr("polyfuse.figures.attention.draw_ban_maps",
                        lambda attention, out, **options: drawn.update(attention=attention, **options) or out)
    drawn.clear()
    assert figure.tabular_attention_figure(module, batch, tmp_path / "g.png", split="all", sample=0) == tmp_path / "g.png"
    assert drawn["title"] == "all sample 0 (row 12): prediction 0.25" and drawn["attention"]["maps"].shape == (2, 3, 3)
