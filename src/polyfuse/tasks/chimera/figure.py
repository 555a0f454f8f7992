"""Chimera's attention figure (``polyfuse plot attention --checkpoint``): for one caption
and its video, the hyperbolic layer's Lorentz attention weights alpha (Chimera Eq. 8:
sigmoid(-beta d(q_i, k_j) - c), d the hyperboloid distance, before the Einstein midpoint
normalises them) over the
joint sequence [caption word pieces; video steps] that the layer reads for that pair
(:meth:`polyfuse.nn.models.chimera.ChimeraRetrievalModel.pair_scores`). Drawn by
:func:`polyfuse.figures.attention.draw_token_attention`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from polyfuse.tasks.attention_figure import sample_title

__all__ = ["pair_attention", "plot_pair_attention"]


@torch.no_grad()
def pair_attention(module: Any, tokens: torch.Tensor, token_mask: torch.Tensor, steps: torch.Tensor,
                   step_mask: torch.Tensor) -> torch.Tensor:
    """(N_t + N_v, N_t + N_v) weights alpha of one (caption, video) pair over its real
    positions, queries in rows: the caption's (B = 1) encoder states ``tokens`` (1, N_t, d)
    and video ``steps`` (1, N_v, d_v) with their masks."""
    model = module.model
    if not model.use_hyperbolic:
        raise ValueError("this Chimera checkpoint has no hyperbolic layer (chimera.hyperbolic_dim: 0), "
                         "so no attention to plot")
    text, video = model.texts(tokens, token_mask), model.videos(steps, step_mask)
    joint = torch.cat((text.hidden, video.hidden), dim=1)
    mask = torch.cat((text.mask, video.mask), dim=1)
    weights = model.hyperbolic(joint, mask, return_weights=True).weights[0]
    real = mask[0]
    return weights[real][:, real]


def plot_pair_attention(module: Any, encoder: Any, data: Any, out: str | Path, *, split: str, sample: int) -> Path:
    """The figure of the ``sample``-th caption of ``split`` (``data``: the checkpoint's
    :class:`polyfuse.tasks.registry.TaskData`, its token states by ``encoder``) with its
    own video."""
    from polyfuse.figures.attention import draw_token_attention

    prepared = data.prepared
    corpus = prepared.splits[data.split]
    if not 0 <= sample < len(corpus.captions):
        raise ValueError(f"sample {sample} outside the {len(corpus.captions)} captions of {split!r}")
    tokens, token_mask = prepared.tokens[data.split]
    video_row = corpus.video_ids.index(corpus.caption_video[sample])
    expert = corpus.experts[prepared.expert]
    rows = slice(sample, sample + 1)
    video, video_mask, _ = expert.gather([video_row], expert.steps)
    weights = pair_attention(module, tokens[rows], token_mask[rows], video, video_mask)
    ids = encoder.tokenize([corpus.captions[sample]])["input_ids"][0].tolist()
    words = encoder.tokenizer.convert_ids_to_tokens(ids)
    steps = int(video_mask.sum())
    labels = [*words, *(f"step {k}" for k in range(steps))]
    if len(labels) != weights.shape[0]:
        raise ValueError(f"the caption has {len(words)} word pieces and the video {steps} steps, but the "
                         f"attention covers {weights.shape[0]} positions")
    title = f"{split} caption {sample} with its video {corpus.caption_video[sample]}: {corpus.captions[sample]}"
    return draw_token_attention(weights.float().numpy(), labels, out, boundary=len(words),
                                title=sample_title(title))
