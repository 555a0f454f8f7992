"""Attention of one sample: MAN's marginal attention over time, BAN's bilinear maps.

The inputs are what :func:`polyfuse.tasks.attention_figure.fusion_attention` returns:
``{"kind": "man", "layers": [[(heads, T_j) per input] per layer], "names": [...]}`` or
``{"kind": "ban", "maps": (G, T_x, T_y), "names": [...]}``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.figures.common import pyplot, save_figure

__all__ = ["draw_ban_maps", "draw_man_attention", "draw_token_attention"]


def draw_man_attention(attention: dict[str, Any], out: str | Path, *, title: str = "", centre: int | None = None) -> Path:
    """Heat maps heads x time steps of each input's marginal attention, per layer; a
    dashed line at step ``centre`` (the centre row of a contextual window)."""
    layers, names = attention["layers"], attention["names"]
    if not layers or any(len(layer) != len(names) for layer in layers):
        raise ValueError(f"draw_man_attention: each layer needs one map per input {names}")
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    rows, columns = len(layers), len(names)
    figure, axes = plt.subplots(rows, columns, figsize=(3.8 * columns, 2.4 * rows + 0.6), squeeze=False)
    for i, layer in enumerate(layers):
        for j, (weights, name) in enumerate(zip(layer, names, strict=True)):
            axis = axes[i, j]
            image = axis.imshow(weights, aspect="auto", cmap="viridis", interpolation="nearest")
            axis.set_title(f"{name}" + (f" (layer {i})" if rows > 1 else ""))
            axis.set_xlabel("time step")
            axis.set_ylabel("head")
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
            axis.yaxis.set_major_locator(MaxNLocator(integer=True))
            if centre is not None and centre < weights.shape[1]:
                axis.axvline(centre, color="white", linestyle="--", linewidth=1)
            figure.colorbar(image, ax=axis, fraction=0.046)
    figure.suptitle(title or "MAN marginal attention over time")
    figure.tight_layout()
    return save_figure(figure, out, dpi=110)


def draw_ban_maps(attention: dict[str, Any], out: str | Path, *, title: str = "") -> Path:
    """One heat map T_x by T_y per glimpse; ``attention["labels"]`` (optional): the T_x and
    T_y tick labels (the words of a caption), else the steps are numbered."""
    from matplotlib.ticker import MaxNLocator

    maps, names = np.asarray(attention["maps"]), attention["names"]
    if maps.ndim != 3:
        raise ValueError(f"draw_ban_maps: maps must be (glimpses, T_x, T_y), got shape {maps.shape}")
    labels = attention.get("labels")
    if labels is not None and [len(labels[0]), len(labels[1])] != list(maps.shape[1:]):
        raise ValueError(f"draw_ban_maps: labels for {[len(side) for side in labels]} steps, maps of {maps.shape[1:]}")
    plt = pyplot()
    glimpses = maps.shape[0]
    width = max(3.4, 0.28 * maps.shape[2] + 2.0 if labels is not None else 0.0)  # one glimpse
    figure, axes = plt.subplots(1, glimpses, figsize=(width * glimpses, 3.2), squeeze=False)
    for g in range(glimpses):
        axis = axes[0, g]
        image = axis.imshow(maps[g], aspect="auto", cmap="magma", interpolation="nearest")
        axis.set_title(f"glimpse {g}")
        if labels is not None:
            axis.set_yticks(range(len(labels[0])), labels[0], fontsize=7)
            axis.set_xticks(range(len(labels[1])), labels[1], rotation=90, fontsize=7)
        else:
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
            axis.yaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel(names[1] if labels is not None else f"{names[1]} step")
        axis.set_ylabel(names[0] if labels is not None else f"{names[0]} step")
        figure.colorbar(image, ax=axis, fraction=0.046)
    # the title wrapped to the figure's width (about 11 characters an inch), not cut at its edges
    figure.suptitle(textwrap.fill(" ".join((title or "BAN bilinear attention maps").split()),
                                  width=max(30, int(11 * width * glimpses))), fontsize=9)
    figure.tight_layout()
    return save_figure(figure, out, dpi=110)


def draw_token_attention(weights: np.ndarray, labels: list[str], out: str | Path, *, boundary: int | None = None,
                         title: str = "") -> Path:
    """One heat map of (N, N) attention weights, queries in rows, each axis labelled;
    lines after the first ``boundary`` positions (the first modality's)."""
    weights = np.asarray(weights)
    if weights.ndim != 2 or weights.shape[0] != weights.shape[1] or weights.shape[0] != len(labels):
        raise ValueError(f"draw_token_attention: weights must be ({len(labels)}, {len(labels)}), got {weights.shape}")
    plt = pyplot()
    size = max(4.0, 0.28 * len(labels) + 2.0)
    figure, axis = plt.subplots(figsize=(size + 1.0, size))
    image = axis.imshow(weights, cmap="viridis", interpolation="nearest")
    axis.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    axis.set_yticks(range(len(labels)), labels, fontsize=7)
    axis.set_xlabel("key")
    axis.set_ylabel("query")
    if boundary is not None and 0 < boundary < len(labels):
        axis.axvline(boundary - 0.5, color="white", linewidth=1)
        axis.axhline(boundary - 0.5, color="white", linewidth=1)
    figure.colorbar(image, ax=axis, fraction=0.046)
    figure.suptitle(title or "attention weights")
    figure.tight_layout()
    return save_figure(figure, out, dpi=110)
