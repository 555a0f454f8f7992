"""A synthetic task with a planted high-order interaction between modalities.

Every modality j is a sequence of Gaussian noise vectors. A few steps of each carry
an *event*: a fixed "key" direction k_j plus a random sign sigma times a fixed "sign"
direction s_j. One event per modality is *aligned*: the three (or m) aligned events
fall in the same relative stretch of time (the same of ``chunks`` equal chunks of
each sample's real length). The others are distractors, placed so that no two
modalities have a distractor in the same chunk, and never in the aligned chunk.

The label is the parity of the aligned signs, prod_j sigma_j (binary: +1 or -1).

Why it separates fusion methods:
- late fusion (mean-pooled modalities, Concat) sees only sums of signs per modality,
  and a product of signs is not a function of those sums;
- tensor fusion of pooled vectors (TFN, LMF) sees the product of the per-modality
  sign sums, in which the aligned product is one of (1 + distractors)^m terms;
- pairwise attention (BAN on two modalities) finds an aligned pair, whose sign
  product carries no information about a parity of three signs;
- multi-linear attention over tuples of time steps can put its weight on the one
  tuple of key events that are close in time and read prod_j sigma_j directly from
  the values (MAN Eq. 5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["PlantedInteraction", "parse_synthetic_options", "planted_interaction"]


@dataclass
class PlantedInteraction:
    """A generated dataset.

    inputs: one (N, T_j, d_j) tensor per modality, padded steps zero.
    masks: one (N, T_j) bool tensor per modality, True at real steps.
    labels: (N,) float tensor of +1 / -1.
    aligned_steps: (N, m) long tensor, the step of the aligned event per modality.
    """

    inputs: list[Tensor]
    masks: list[Tensor]
    labels: Tensor
    aligned_steps: Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]

    def subset(self, index: Tensor | slice) -> PlantedInteraction:
        return PlantedInteraction(
            [x[index] for x in self.inputs],
            [m[index] for m in self.masks],
            self.labels[index],
            self.aligned_steps[index],
        )


def planted_interaction(
    num_samples: int,
    *,
    num_modalities: int = 3,
    lengths: Sequence[int] = (16, 20, 24),
    feature_dims: Sequence[int] = (16, 12, 8),
    chunks: int = 8,
    distractors: int = 2,
    noise: float = 1.0,
    signal: float = 2.0,
    min_length_fraction: float = 0.75,
    seed: int = 0,
) -> PlantedInteraction:
    """Generate the planted-interaction task (see the module docstring).

    Args:
        num_samples: N.
        num_modalities: m >= 2; ``lengths`` and ``feature_dims`` are cycled if shorter.
        lengths: maximum length T_j per modality; each sample's real length is
            drawn uniformly from [min_length_fraction * T_j, T_j] (the rest is padding).
        feature_dims: d_j per modality.
        chunks: number of equal chunks of each real length in which events are placed.
        distractors: distractor events per modality.
        noise: standard deviation of the background noise.
        signal: size of the key and sign components of an event.
        seed: everything is drawn from a generator seeded with it.
    """
    if num_modalities < 2:
        raise ValueError(f"num_modalities must be >= 2, got {num_modalities}")
    if 1 + num_modalities * distractors > chunks:
        raise ValueError(
            f"{num_modalities} modalities with {distractors} distractors each need at least "
            f"{1 + num_modalities * distractors} chunks, got chunks={chunks}"
        )
    lengths = [lengths[j % len(lengths)] for j in range(num_modalities)]
    feature_dims = [feature_dims[j % len(feature_dims)] for j in range(num_modalities)]
    if min(lengths) < chunks:
        raise ValueError(f"every length must be >= chunks={chunks}, got {lengths}")
    generator = torch.Generator().manual_seed(seed)

    def directions(dim: int) -> tuple[Tensor, Tensor]:
        q, _ = torch.linalg.qr(torch.randn(dim, 2, generator=generator))
        return q[:, 0], q[:, 1]

    key_sign = [directions(d) for d in feature_dims]
    signs = torch.randint(0, 2, (num_samples, num_modalities), generator=generator) * 2 - 1
    labels = signs.prod(dim=1).float()
    # Chunk of the aligned event, then a permutation of the other chunks for distractors.
    order = torch.argsort(torch.rand(num_samples, chunks, generator=generator), dim=1)
    aligned_chunk = order[:, 0]
    distractor_chunks = order[:, 1 : 1 + num_modalities * distractors].reshape(
        num_samples, num_modalities, distractors
    )
    inputs, masks, aligned_steps = [], [], []
    for j, (max_length, dim) in enumerate(zip(lengths, feature_dims, strict=True)):
        low = max(chunks, round(min_length_fraction * max_length))
        real_length = torch.randint(low, max_length + 1, (num_samples,), generator=generator)
        mask = torch.arange(max_length) < real_length.unsqueeze(1)
        x = noise * torch.randn(num_samples, max_length, dim, generator=generator)
        key, sign_direction = key_sign[j]

        def step_in(chunk: Tensor, real_length: Tensor = real_length) -> Tensor:
            start = torch.div(chunk * real_length + chunks - 1, chunks, rounding_mode="floor")
            stop = torch.div((chunk + 1) * real_length + chunks - 1, chunks, rounding_mode="floor")
            offset = torch.rand(chunk.shape, generator=generator) * (stop - start).float()
            return start + offset.long().clamp_max(stop - start - 1)

        rows = torch.arange(num_samples)
        aligned = step_in(aligned_chunk)
        x[rows, aligned] += signal * (key + signs[:, j, None].float() * sign_direction)
        for d in range(distractors):
            step = step_in(distractor_chunks[:, j, d])
            sign = torch.randint(0, 2, (num_samples, 1), generator=generator).float() * 2 - 1
            x[rows, step] += signal * (key + sign * sign_direction)
        inputs.append(x * mask.unsqueeze(-1))
        masks.append(mask)
        aligned_steps.append(aligned)
    return PlantedInteraction(inputs, masks, labels, torch.stack(aligned_steps, dim=1))


def parse_synthetic_options(
    spec: str, defaults: Mapping[str, Any], convert: Callable[[str, str], Any]
) -> dict[str, Any]:
    """The options of a ``synthetic`` or ``synthetic:key=value,...`` data spec over
    ``defaults``. An item without ``=`` or with an unknown key is refused with the allowed
    keys; ``convert(key, text)`` turns a value's text into its option, raising ValueError
    with its own message. Shared by the sentiment and the retrieval generators."""
    _, _, rest = spec.partition(":")
    options = dict(defaults)
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in defaults:
            raise ValueError(f"bad synthetic option {item!r}; write key=value with keys: {', '.join(defaults)}")
        options[key] = convert(key, value)
    return options

