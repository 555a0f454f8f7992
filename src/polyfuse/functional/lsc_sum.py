"""MAN's LSC kernel summed exactly over chunk tuples, one histogram of chunks at a time.

With C chunks and E(c) the LSC vector of chunk c (MAN Eq. 8: +e at the positions up to c,
-e after), E(c) . E(c') = e^2 (C - 2 |c - c'|) (note 3 of the papers' README). So the LSC
logit of a tuple of chunks (c_1, .., c_m), ``temperature sum_{j<k} E(c_j) . E(c_k)``, is

    temperature e^2 [C m (m - 1) / 2 - 2 sum_{a<b} n_a n_b (b - a)],

a function of the histogram n of the tuple alone (n_a: how many modalities are in chunk
a; sum_{j<k} |c_j - c_k| counts each pair of modalities once, by the chunks they are in).
The sum over all C^m tuples of the had steps with the LSC part exact
(:func:`polyfuse.functional._had.had_exact_lsc`),

    sum_c kappa(c) prod_j F_j[c_j],   F_j (..., C, F),

is then a sum over histograms, ``sum_n kappa(n) D_m[n]``, where D_j[n] sums prod_{i<=j}
F_i[c_i] over the tuples of the first j modalities with histogram n, built one modality at
a time: ``D_j[n + e_c] += D_{j-1}[n] F_j[c]``. Its cost is sum_j |S_{j-1}| C_j F
multiplications, with S_j the histograms the first j modalities can reach (at most
binom(j + C - 1, C - 1): polynomial in m for a fixed C, where the tuples grow as C^m) and
C_j the chunks a step of modality j can fall in (one for a modality of one step: a chunk
no step occupies costs nothing). For m = 6 and C = 4 that is 504 F against 5,460 F for
the contraction over tuples; for the MAN paper's retrieval setting (m = 7, C = 10),
80,080 F against 1.1 x 10^7 F.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["HistogramPlan", "LscSum", "histogram_log_kappa", "histogram_plan", "lsc_sum_of", "occupied_chunks", "tuple_sum"]

# Elements of the largest product one block of rows builds (2 MB in float32): the recursion
# is memory-bound, and blocks that stay in cache halved its time at m = 6, C = 4 (one thread,
# scripts/bench_many_modalities.py: 203 ms against 106 ms per forward+backward).
BLOCK_ELEMENTS = 1 << 19
# The tuples are contracted densely (one modality at a time over the table of kappa) while
# that work is at most this many times the recursion's: per unit of work the dense
# contraction ran 1.9 to 2.6 times faster (m = 3 and 6, C = 4, the same script).
DENSE_ADVANTAGE = 2.5


def occupied_chunks(length: int, chunks: int) -> tuple[int, ...]:
    """The chunks a real step of a modality of ``length`` steps can fall in: step r of n
    real steps (n <= length, padding anywhere) is in chunk floor(r C / n)."""
    if length >= chunks:  # n = C real steps occupy every chunk
        return tuple(range(chunks))
    return tuple(sorted({r * chunks // n for n in range(1, length + 1) for r in range(n)}))


@dataclass(frozen=True)
class HistogramPlan:
    """The histograms of chunks reachable modality after modality, and how each step of
    the recursion maps (histogram, chunk) pairs to the next histograms.

    ``occupied[j]``: the chunks of modality j (long, C_j); ``targets[j - 1]``, for
    modality j >= 1: the index in S_j of (histogram s of S_{j-1}) + e_(occupied[j][c]),
    laid out s-major, c-minor (long, |S_{j-1}| C_j); ``sizes[j]``: |S_{j+1}|, the
    histograms of the first j + 1 modalities; ``histograms``: S_m, (|S_m|, C).
    """

    occupied: tuple[Tensor, ...]
    targets: tuple[Tensor, ...]
    sizes: tuple[int, ...]
    histograms: Tensor

    @property
    def work(self) -> int:
        """Products of one row with F = 1 of the recursion: sum_j |S_{j-1}| C_j."""
        return sum(size * len(chunks) for size, chunks in zip((1, *self.sizes[:-1]), self.occupied, strict=True))

    @property
    def dense_work(self) -> int:
        """Products of one row with F = 1 of the dense contraction over the occupied
        chunks' tuples, last modality first: prod_j C_j + prod_{j<m-1} C_j + ... + C_0."""
        counts = [len(chunks) for chunks in self.occupied]
        return sum(math.prod(counts[:j]) for j in range(1, len(counts) + 1))

    @property
    def dense(self) -> bool:
        """Whether :func:`tuple_sum` contracts the tuples densely (cheaper for few tuples)."""
        return self.dense_work <= DENSE_ADVANTAGE * self.work


@functools.lru_cache(maxsize=64)
def _plan_on_host(chunks: int, occupied: tuple[tuple[int, ...], ...]) -> tuple[list, list, list[tuple[int, ...]]]:
    states: list[tuple[int, ...]] = [(0,) * chunks]
    targets, sizes = [], []
    for j, allowed in enumerate(occupied):
        index: dict[tuple[int, ...], int] = {}
        step = []
        for state in states:
            for chunk in allowed:
                following = (*state[:chunk], state[chunk] + 1, *state[chunk + 1:])
                step.append(index.setdefault(following, len(index)))
        if j > 0:  # the first modality's states are its chunks, in order
            targets.append(step)
        states = list(index)
        sizes.append(len(states))
    return targets, sizes, states


_PLANS: dict[tuple, HistogramPlan] = {}


def histogram_plan(chunks: int, occupied: Sequence[Sequence[int]], device: torch.device | str) -> HistogramPlan:
    """The :class:`HistogramPlan` of modalities that occupy ``occupied[j]`` of ``chunks``
    chunks (built once per arguments on the host, kept)."""
    key = (int(chunks), tuple(tuple(int(c) for c in allowed) for allowed in occupied), str(device))
    cached = _PLANS.get(key)
    if cached is not None:
        return cached
    if any(not allowed for allowed in key[1]):
        raise ValueError(f"every modality occupies at least one chunk, got {list(key[1])}")
    targets, sizes, states = _plan_on_host(key[0], key[1])
    as_long = functools.partial(torch.tensor, dtype=torch.long, device=device)
    plan = HistogramPlan(tuple(as_long(allowed) for allowed in key[1]), tuple(as_long(t) for t in targets),
                         tuple(sizes), as_long(states).reshape(len(states), key[0]))
    if len(_PLANS) < 256:
        _PLANS[key] = plan
    return plan


def histogram_log_kappa(histograms: Tensor, scale: float, temperature: float) -> Tensor:
    """The LSC logit of every histogram (|S|, C), less the largest, in float64: of
    temperature e^2 [C m (m - 1) / 2 - 2 sum_{a<b} n_a n_b (b - a)] (module doc) only the
    second term varies, the first is a constant of m and C that the largest takes away."""
    counts = histograms.to(torch.float64)
    position = torch.arange(counts.shape[-1], dtype=torch.float64, device=counts.device)
    distance = (position[None, :] - position[:, None]).clamp_min(0)  # b - a for a < b, else 0
    separated = torch.einsum("sa,ab,sb->s", counts, distance, counts)  # sum_{a<b} n_a n_b (b - a)
    logits = -2 * temperature * scale**2 * separated
    return logits - logits.max()


@dataclass(frozen=True)
class LscSum:
    """What :func:`tuple_sum` needs besides the factors: the plan and kappa in the
    factors' dtype, largest 1: of the final histograms (|S_m|,), or, when the plan is
    :attr:`~HistogramPlan.dense`, of the occupied chunks' tuples (C_0, .., C_{m-1})."""

    plan: HistogramPlan
    kappa: Tensor


def lsc_sum_of(lengths: Sequence[int], chunks: int, scale: float, temperature: float, dtype: torch.dtype,
               device: torch.device | str) -> LscSum:
    """The :class:`LscSum` of modalities of ``lengths`` steps (each modality's occupied
    chunks from its length, :func:`occupied_chunks`)."""
    plan = histogram_plan(chunks, [occupied_chunks(length, chunks) for length in lengths], device)
    kappa = _kappa(plan, float(scale), float(temperature), dtype)
    return LscSum(plan, kappa)


_KAPPAS: dict[tuple, Tensor] = {}


def _kappa(plan: HistogramPlan, scale: float, temperature: float, dtype: torch.dtype) -> Tensor:
    key = (id(plan), plan.dense, scale, temperature, dtype)
    cached = None if torch.compiler.is_compiling() else _KAPPAS.get(key)
    if cached is not None:
        return cached
    if plan.dense:  # the histogram of every tuple of occupied chunks, (C_0, .., C_{m-1}, C)
        grids = torch.meshgrid(*plan.occupied, indexing="ij")
        histograms = sum(torch.nn.functional.one_hot(grid, plan.histograms.shape[1]) for grid in grids)
        log_kappa = histogram_log_kappa(histograms.flatten(0, -2), scale, temperature).view(histograms.shape[:-1])
    else:
        log_kappa = histogram_log_kappa(plan.histograms, scale, temperature)
    kappa = log_kappa.exp().to(dtype)
    if not torch.compiler.is_compiling() and len(_KAPPAS) < 256:
        _KAPPAS[key] = kappa
    return kappa


def tuple_sum(factors: Sequence[Tensor], lsc: LscSum) -> Tensor:
    """``sum_c kappa(c) prod_j factors[j][..., c_j, :]`` over all chunk tuples, for m
    factors (..., C, F) with the same leading dims, by histogram (module doc), or densely
    over the occupied chunks' tuples when they are few (:attr:`HistogramPlan.dense`).
    Returns (..., F). Rows (the leading dims) go in blocks whose largest product stays within
    :data:`BLOCK_ELEMENTS`; differentiable."""
    plan = lsc.plan
    if len(factors) != len(plan.occupied):
        raise ValueError(f"tuple_sum: {len(factors)} factors for a plan of {len(plan.occupied)} modalities")
    if plan.dense:
        return _tuple_sum_dense(factors, plan, lsc.kappa)
    lead, width = factors[0].shape[:-2], factors[0].shape[-1]
    flat = [f.reshape(-1, *f.shape[-2:]) for f in factors]
    rows = flat[0].shape[0]
    largest = max((size * len(chunks) for size, chunks in zip(plan.sizes, plan.occupied[1:], strict=False)),
                  default=1)
    block = max(1, BLOCK_ELEMENTS // max(1, largest * width))
    if block >= rows:
        return _tuple_sum_rows(flat, plan, lsc.kappa).reshape(*lead, width)
    parts = [_tuple_sum_rows([f[start:start + block] for f in flat], plan, lsc.kappa)
             for start in range(0, rows, block)]
    return torch.cat(parts).reshape(*lead, width)


def _tuple_sum_rows(factors: Sequence[Tensor], plan: HistogramPlan, kappa: Tensor) -> Tensor:
    # Histograms lead, rows and features trail: every step adds whole (rows F) rows.
    by_chunk = [f.permute(1, 0, 2).flatten(1) for f in factors]  # (C, rows F)
    states = by_chunk[0].index_select(0, plan.occupied[0])  # D_1: (C_0, rows F)
    for factor, chunks, targets, size in zip(by_chunk[1:], plan.occupied[1:], plan.targets, plan.sizes[1:],
                                             strict=True):
        products = states.unsqueeze(1) * factor.index_select(0, chunks).unsqueeze(0)  # (S, C_j, rows F)
        states = products.new_zeros(size, products.shape[-1]).index_add(0, targets, products.flatten(0, 1))
    return (kappa @ states).view(factors[0].shape[0], factors[0].shape[-1])  # sum_n kappa(n) D_m[n]


def _tuple_sum_dense(factors: Sequence[Tensor], plan: HistogramPlan, kappa: Tensor) -> Tensor:
    """The contraction over the table of kappa, one modality at a time, last first."""
    selected = [f.index_select(-2, chunks) for f, chunks in zip(factors, plan.occupied, strict=True)]
    counts = [len(chunks) for chunks in plan.occupied]
    accumulated = kappa.reshape(-1, counts[-1]) @ selected[-1]  # (..., prod_{j<m-1} C_j, F)
    for j in range(len(selected) - 2, -1, -1):
        accumulated = accumulated.unflatten(-2, (math.prod(counts[:j]), counts[j]))  # (..., prod_{i<j}, C_j, F)
        accumulated = (accumulated * selected[j].unsqueeze(-3)).sum(-2)
    return accumulated.squeeze(-2)
