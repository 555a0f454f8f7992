"""The attention figure of one sample's fusion (``polyfuse plot attention --checkpoint``)
for the tasks whose model fuses its inputs with a module of :mod:`polyfuse.nn`: MAN's
marginal attention of each input over its time steps (whatever the mode), or BAN's G
bilinear maps. The tabular tasks draw their backbone's fusion; retrieval its video
encoder's MAN over the experts (:meth:`polyfuse.tasks.retrieval.spec.RetrievalSpec.attention_figures`).
Drawn by :mod:`polyfuse.figures.attention`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["TITLE_WIDTH", "draw_fusion_attention", "fusion_attention", "sample_title", "tabular_attention_figure"]

TITLE_WIDTH = 90


def sample_title(text: str, width: int = TITLE_WIDTH) -> str:
    """A figure title wrapped onto lines of at most ``width`` characters, so that long
    vectors (a traits checkpoint's predictions and labels) are not cut off."""
    return "\n".join(textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False))


def _short(value: Tensor) -> str:
    """A tensor value for a title: 3 significant decimals, lists kept short."""
    values = value.reshape(-1).tolist()
    text = ", ".join(f"{v:.3g}" for v in values)
    return text if len(values) == 1 else f"[{text}]"


@torch.no_grad()
def fusion_attention(fusion: nn.Module, inputs: Sequence[Tensor], masks: Sequence[Tensor],
                     names: Sequence[str]) -> dict[str, Any]:
    """The attention of ``fusion`` on a one-sample batch: ``{"kind": "man", "layers":
    [[(heads, T_j) per input] per layer]}`` for MAN, ``{"kind": "ban", "maps": (G, T_x,
    T_y)}`` for BAN, each with the input ``names`` and real ``lengths``; another module is
    a ValueError (it has no attention to show)."""
    from polyfuse.functional.multilinear import attention_marginals
    from polyfuse.nn import BAN, MAN

    real = [m[0] for m in masks]  # the steps shown: the real ones
    lengths = [int(r.sum()) for r in real]
    if isinstance(fusion, MAN):
        output = fusion(list(inputs), list(masks), return_details=True)
        layers = [[a[0][:, r].float().numpy() for a, r in zip(attention_marginals(layer, len(real)), real, strict=True)]
                  for layer in output.attention]
        return {"kind": "man", "layers": layers, "names": list(names), "lengths": lengths}
    if isinstance(fusion, BAN):
        maps = fusion(list(inputs), list(masks), return_details=True).attention[0]
        return {"kind": "ban", "maps": maps[:, real[0]][:, :, real[1]].float().numpy(),
                "names": list(names), "lengths": lengths}
    raise ValueError(f"fusion {type(fusion).__name__} has no attention to plot; MAN and BAN have")


def draw_fusion_attention(attention: dict[str, Any], out: str | Path, *, title: str,
                          centre: int | None = None) -> Path:
    from polyfuse.figures.attention import draw_ban_maps, draw_man_attention

    if attention["kind"] == "man":
        return draw_man_attention(attention, out, title=sample_title(title), centre=centre)
    return draw_ban_maps(attention, out, title=sample_title(title))


@torch.no_grad()
def tabular_attention_figure(module: Any, batch: dict[str, Any], out: str | Path, *, split: str,
                             sample: int) -> Path:
    """The figure of a tabular task's one-sample ``batch`` (a
    :meth:`polyfuse.data.datamodule.FusionDataModule.sample`), its title the prediction
    and the label when known; the centre row of a contextual window marked."""
    module.eval()
    backbone = module.backbone
    encoded = backbone.encode(batch["inputs"], batch["masks"])
    inputs, masks = backbone.fusion_inputs(encoded, batch["masks"])
    attention = fusion_attention(backbone.fusion, inputs, masks, backbone.group_names())
    prediction = _short(module.predictions(module(batch))[0])
    label = "" if "target" not in batch else f", label {_short(batch['target'][0])}"
    title = f"{split} sample {sample} (row {int(batch['row'][0])}): prediction {prediction}{label}"
    centre = int(batch["centre"][0]) if "centre" in batch else None
    return draw_fusion_attention(attention, out, title=title, centre=centre)
