"""The generalizable multi-linear attention network (MAN; Jin and Zhao, NeurIPS 2021).

Shapes: ``B`` batch, ``G`` heads, ``T_j`` length of modality j, ``d_j`` its feature
size, ``K`` per-head value size (hidden_dim / heads), ``K'`` per-head attention size,
``C`` LSC chunks, ``H`` random features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from einops import rearrange
from torch import Tensor, nn

from polyfuse._checks import check_values
from polyfuse.functional.multilinear import (
    ESTIMATORS,
    MODES,
    resolve_mode,
    stacked_multilinear_attention,
)
from polyfuse.functional.random_features import gaussian_random_matrix
from polyfuse.nn.base import FusionModule, FusionOutput
from polyfuse.nn.registry import register

__all__ = ["MAN", "STACKINGS", "MultiLinearAttentionLayer"]

STACKINGS = ("per_modality", "shared")


class MultiLinearAttentionLayer(nn.Module):
    """One multi-head multi-linear attention block (MAN section 2.2, appendix Algorithm 1).

    Per modality j and head g: values V_j^T U'_j (B, T_j, K) and attention features
    V_j^T U''_j (B, T_j, K') with the LSC vectors appended (Eq. 8); the attention of
    :func:`multilinear_attention` fuses them into f' (B, K), the per-head pooling
    matrix P maps f = P^T f', and the heads are concatenated to (B, G K).
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        *,
        hidden_dim: int,
        heads: int,
        attention_dim: int,
        num_random_features: int,
        orthogonal: bool,
        chunks: int,
        lsc_scale: float,
        mode: str,
        temperature: float,
        generator: torch.Generator,
        estimator: str = "gerf",
        exact_lsc: bool = True,
        exact_limit: int | None = None,
    ) -> None:
        super().__init__()
        if hidden_dim % heads:
            raise ValueError(f"hidden_dim {hidden_dim} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = hidden_dim // heads
        self.attention_dim = attention_dim
        self.chunks = chunks
        self.lsc_scale = lsc_scale
        self.mode = mode
        self.temperature = temperature
        self.estimator = estimator
        self.exact_lsc = exact_lsc
        self.exact_limit = exact_limit
        self.last_mode: str | None = None  # the mode of the last call ("auto" resolved)
        self.orthogonal = orthogonal
        self.hidden_dim = hidden_dim
        # U'_j (values, hidden_dim rows) and U''_j (attention features, G K' rows) of each
        # modality as one linear map, so that a forward projects each modality once.
        # Drawn as every modality's value map, then every modality's feature map, and
        # joined: the order the seeds of docs/RESULTS.md's MAN rows drew them in, so that
        # those rows reproduce (one joint nn.Linear has the same distribution, other draws).
        values = [nn.Linear(d, hidden_dim) for d in input_dims]
        features = [nn.Linear(d, heads * attention_dim) for d in input_dims]
        self.projections = nn.ModuleList()
        for d, value_map, feature_map in zip(input_dims, values, features, strict=True):
            joint = nn.utils.skip_init(nn.Linear, d, hidden_dim + heads * attention_dim)
            with torch.no_grad():
                joint.weight.copy_(torch.cat([value_map.weight, feature_map.weight]))
                joint.bias.copy_(torch.cat([value_map.bias, feature_map.bias]))
            self.projections.append(joint)
        pooling = torch.stack([torch.eye(self.head_dim)] * heads)  # P, one per head
        self.pooling = nn.Parameter(pooling + 0.01 * torch.randn(pooling.shape, generator=generator))
        self.register_buffer(
            "random_matrix",
            self._draw(num_random_features, generator),
            persistent=True,
        )

    def _draw(self, num_random_features: int, generator: torch.Generator) -> Tensor:
        dim = self.attention_dim + self.chunks
        return torch.stack(
            [
                gaussian_random_matrix(
                    num_random_features, dim, orthogonal=self.orthogonal, generator=generator
                )
                for _ in range(self.heads)
            ]
        )  # (G, H, K' + C): one matrix per head, shared by all modalities (note 2)

    def redraw_random_features(self, generator: torch.Generator) -> None:
        fresh = self._draw(self.random_matrix.shape[1], generator).to(self.random_matrix.dtype)
        if self.random_matrix.device.type == "cuda":  # an asynchronous copy: no wait for the device
            fresh = fresh.pin_memory()
        self.random_matrix.copy_(fresh, non_blocking=True)

    def forward(
        self, sequences: Sequence[Tensor], masks: Sequence[Tensor], return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor | list[Tensor]]:
        """sequences: (B, T_j, d_j) with padded steps zeroed; masks: (B, T_j) bool.

        The modalities are stacked along time once, after their projections, so that the
        heads, the LSC vectors and the attention handle all of them in one operation
        each (:func:`stacked_multilinear_attention`).
        """
        lengths = [x.shape[-2] for x in sequences]
        projected = torch.cat([project(x) for project, x in zip(self.projections, sequences, strict=True)], -2)
        mask = torch.cat(list(masks), dim=-1)  # (B, T)
        values, features = projected.split([self.hidden_dim, projected.shape[-1] - self.hidden_dim], -1)
        values = rearrange(values, "b t (g k) -> b g t k", g=self.heads)  # U'_j^T v_j per head
        features = rearrange(features, "b t (g k) -> b g t k", g=self.heads)  # U''_j^T v_j per head
        if check_values(mask) and bool(mask.all()):
            # Nothing padded: the attention skips the masks' work (filling, counting real
            # steps). Knowing it reads the mask back, so only where a read is free (the CPU).
            mask = None
        # "auto": exact while heads x prod_j T_j (per sample) fits the budget, had beyond
        self.last_mode = resolve_mode(self.mode, self.heads * math.prod(lengths), self.exact_limit)
        result = stacked_multilinear_attention(
            features,
            values,
            lengths,
            None if mask is None else mask.unsqueeze(1),
            mode=self.last_mode,
            random_matrix=self.random_matrix,
            temperature=self.temperature,
            estimator=self.estimator,
            return_attention=return_attention,
            chunks=self.chunks,  # Eq. 8: the LSC vectors, appended or exact (see exact_lsc)
            lsc_scale=self.lsc_scale,
            exact_lsc=self.exact_lsc,
        )
        fused, attention = result if return_attention else (result, None)
        fused = torch.einsum("bgk,gkc->bgc", fused, self.pooling)  # f = P^T f' per head
        fused = rearrange(fused, "b g c -> b (g c)")  # concatenate heads
        return (fused, attention) if return_attention else fused


def _mix(seed: int, count: int) -> int:
    """A 32-bit seed for draw ``count`` of a module seeded ``seed`` (the CPU generator keeps
    32 bits of its seed): splitmix64's finaliser of seed * golden ratio + count, so that
    nearby (seed, count) pairs give unrelated seeds."""
    mask = (1 << 64) - 1
    x = (seed * 0x9E3779B97F4A7C15 + count) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) & 0xFFFFFFFF


@register("man")
class MAN(FusionModule):
    """Multi-linear attention network: joint attention over all modalities' time steps.

    Args:
        input_dims: feature size of each modality (m >= 2).
        out_dim: size of the fused output.
        hidden_dim: size of the concatenated heads (the paper's hidden size d).
        heads: number of heads G; each has K = hidden_dim / G value channels.
        attention_dim: per-head attention size K' (default K, as in Algorithm 1).
        num_random_features: H, random features per head for ``mode="had"``.
        orthogonal: orthogonal random features (appendix G) rather than i.i.d.
        chunks: LSC chunks C (0 disables LSC: the "w/o LSC" ablation). Default 4
            (the paper's CMU-MOSI setting), and 0 in hadamard mode, where the
            constraints cannot be used.
        lsc_scale: e, the entry size of the LSC vectors.
        mode: "auto" (default): per call, "exact" while heads x prod_j T_j (the
            tuples of one sample) <= ``exact_limit`` and "had" beyond
            (:func:`~polyfuse.functional.resolve_mode`; per sample, so that the batch
            size never changes the mode; the mode each layer used is in
            ``return_details``'s ``modes``); "had" (MAN), "exact" (the "w/o HAD"
            ablation) or "hadamard" ("w/o CAO").
        exact_limit: the budget of the auto mode in tuples per sample (default
            :data:`~polyfuse.functional.multilinear.AUTO_EXACT_TUPLES`, 2^16: about
            where exact attention stops being faster than had on a CPU,
            docs/HAD_ESTIMATOR.md section 10).
        temperature: logit scale; default 1 / sqrt(K').
        estimator: the random features of had mode (see
            :func:`~polyfuse.functional.multilinear_attention`): ``"gerf"`` (default,
            centred generalised features, docs/HAD_ESTIMATOR.md) or ``"arf"`` (the
            paper's addition random features, MAN Eq. 11).
        exact_lsc: in had mode, compute the LSC part of the logits exactly over the
            C^m chunk tuples and leave only the learned features to the random
            features (default; the LSC codes carry most of the features' norm, and
            estimating them costs accuracy: docs/HAD_ESTIMATOR.md section 9). Used
            by histogram of chunks while that recursion's work is at most
            ``EXACT_LSC_WORK`` (2^13: m <= 13 at C = 4, m <= 4 at C = 10); False estimates
            them too (polyfuse before this option).
        layers: number of stacked residual layers (MAN Eq. 13).
        residual: project every modality to hidden_dim first and, after each layer,
            add a fused vector to every real step of each modality (Eq. 13), so
            that ``return_details=True`` gives the updated sequences. Default: on
            when layers > 1 (required there), off for a single layer, whose
            returned sequences are then the inputs themselves.
        stacking: how residual layers are stacked.
            ``"per_modality"`` (default, MAN Eq. 13): in layer n each modality l
            gets its own pass, in which its current sequence f_n^l meets the
            *original* (projected) sequences V_j of the other modalities, and
            f_{n+1}^l = MAN(f_n^l, {V_j | j != l}) 1^T + f_n^l. The m passes run
            as one call of the layer on the m variants stacked along the batch
            axis (m times the memory of one pass); in the first layer all m
            passes see the same sequences, so it runs once. The fused output is
            the mean of the last layer's m pass outputs (the paper does not say
            how a stacked MAN is read out; for one layer this is its only pass).
            ``"shared"`` (a variant, polyfuse before this option existed): each
            layer runs one pass over all the updated sequences f_n^1..f_n^m and
            adds the same vector to every modality; the output is the last pass.
        dropout: dropout on each layer's fused vector.
        seed: seeds the generator that draws the random features and the pooling
            initialisation noise.
        redraw_in_training: draw fresh random features at every training forward,
            from a generator seeded by (seed, count of earlier draws; the count is
            the buffer ``draws`` of the state dict, so a resumed run draws what an
            uninterrupted one would); evaluation uses the last draw. Off by default:
            it helped on the demo (H = 64) and hurt on CMU-MOSI at the paper's H = 24
            (docs/HAD_ESTIMATOR.md section 9). Off, the features change only through
            :meth:`redraw_random_features`.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        hidden_dim: int = 64,
        heads: int = 4,
        attention_dim: int | None = None,
        num_random_features: int = 64,
        orthogonal: bool = True,
        chunks: int | None = None,
        lsc_scale: float = 0.5,
        mode: str = "auto",
        temperature: float | None = None,
        estimator: str = "gerf",
        exact_lsc: bool = True,
        exact_limit: int | None = None,
        layers: int = 1,
        residual: bool | None = None,
        stacking: str = "per_modality",
        dropout: float = 0.0,
        seed: int = 0,
        redraw_in_training: bool = False,
    ) -> None:
        super().__init__(input_dims, out_dim)
        if mode not in MODES:
            raise ValueError(f"MAN: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        if estimator not in ESTIMATORS:
            raise ValueError(
                f"MAN: unknown estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}"
            )
        if chunks is None:
            chunks = 0 if mode == "hadamard" else 4
        if mode == "hadamard" and chunks:
            raise ValueError("MAN: hadamard mode (w/o CAO) cannot use LSC; set chunks=0")
        if layers < 1 or heads < 1 or num_random_features < 1 or chunks < 0:
            raise ValueError(
                f"MAN: layers, heads and num_random_features must be >= 1 and chunks >= 0, got "
                f"layers={layers}, heads={heads}, num_random_features={num_random_features}, "
                f"chunks={chunks}"
            )
        if hidden_dim % heads:
            raise ValueError(f"MAN: hidden_dim {hidden_dim} is not divisible by heads {heads}")
        if stacking not in STACKINGS:
            raise ValueError(
                f"MAN: unknown stacking {stacking!r}; expected one of {', '.join(STACKINGS)}"
            )
        self.stacking = stacking
        attention_dim = attention_dim or hidden_dim // heads
        self.mode = mode
        self._generator = torch.Generator().manual_seed(seed)
        self.seed = seed
        self.redraw_in_training = redraw_in_training
        # Training forwards that drew fresh random features, kept in the state dict (and in
        # Python, so that a draw never reads the buffer back from a device).
        self._draws = 0
        self.register_buffer("draws", torch.zeros((), dtype=torch.long), persistent=True)
        self._register_load_state_dict_pre_hook(self._load_draws)
        residual = layers > 1 if residual is None else residual
        if layers > 1 and not residual:
            raise ValueError("MAN: stacked layers (layers > 1) are residual (Eq. 13); drop residual=False")
        if residual:
            self.input_projections = nn.ModuleList(
                nn.Identity() if d == hidden_dim else nn.Linear(d, hidden_dim)
                for d in self.input_dims
            )
            layer_dims = [hidden_dim] * self.num_modalities
        else:
            self.input_projections = None
            layer_dims = self.input_dims
        self.layers = nn.ModuleList(
            MultiLinearAttentionLayer(
                layer_dims,
                hidden_dim=hidden_dim,
                heads=heads,
                attention_dim=attention_dim,
                num_random_features=num_random_features,
                orthogonal=orthogonal,
                chunks=chunks,
                lsc_scale=lsc_scale,
                mode=mode,
                temperature=1.0 / math.sqrt(attention_dim) if temperature is None else temperature,
                generator=self._generator,
                estimator=estimator,
                exact_lsc=exact_lsc,
                exact_limit=exact_limit,
            )
            for _ in range(layers)
        )
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Identity() if out_dim == hidden_dim else nn.Linear(hidden_dim, out_dim)

    @torch.no_grad()
    def redraw_random_features(self, generator: torch.Generator | None = None) -> None:
        """Draw new random features for every layer and head (from ``generator``, or
        the module's own seeded generator); training forwards draw their own unless
        ``redraw_in_training=False``."""
        for layer in self.layers:
            layer.redraw_random_features(generator or self._generator)

    def _load_draws(self, state_dict: dict, prefix: str, *args: object) -> None:
        key = prefix + "draws"
        if key in state_dict:  # a state dict without it is refused by load_state_dict (strict)
            self._draws = int(state_dict[key])

    @torch.no_grad()
    def _draw_for_this_step(self) -> None:
        """Fresh random features for a training forward, from a generator seeded by
        (seed, number of earlier draws): reproducible, and resumed with the state dict."""
        generator = torch.Generator().manual_seed(_mix(self.seed, self._draws))
        for layer in self.layers:
            layer.redraw_random_features(generator)
        self._draws += 1
        self.draws.fill_(self._draws)

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        return self._fuse(inputs, masks, details=False)

    def fuse_details(self, inputs: list[Tensor], masks: list[Tensor]) -> FusionOutput:
        """The fused output, the sequences after the last layer (the inputs themselves for
        a non-residual MAN) and one attention entry per layer (see :class:`FusionOutput`;
        for the layers after the first of a ``stacking="per_modality"`` MAN, the mean of
        that attention over the layer's m passes, Eq. 13)."""
        return self._fuse(inputs, masks, details=True)

    def _fuse(
        self, sequences: list[Tensor], full_masks: list[Tensor], details: bool
    ) -> Tensor | FusionOutput:
        """The body of :meth:`forward` on validated inputs (padded steps zeroed)."""
        if self.training and self.redraw_in_training and self.mode in ("had", "auto"):
            self._draw_for_this_step()
        if self.input_projections is not None:
            sequences = [
                project(x) * mask.unsqueeze(-1)
                for project, x, mask in zip(self.input_projections, sequences, full_masks, strict=True)
            ]
        originals = sequences  # V_j of MAN Eq. 13 (projected to hidden_dim)
        attentions = []
        fused = None
        for index, layer in enumerate(self.layers):
            if self.stacking == "per_modality" and index > 0:
                passes, attention = self._per_modality_passes(
                    layer, sequences, originals, full_masks, details
                )  # (m, B, hidden_dim)
                passes = self.dropout(passes)
                fused = passes.mean(0)
            else:
                result = layer(sequences, full_masks, return_attention=details)
                fused, attention = result if details else (result, None)
                fused = self.dropout(fused)
                passes = fused.expand(self.num_modalities, *fused.shape)  # all passes alike
            attentions.append(attention)
            if self.input_projections is not None:
                # MAN Eq. 13: f_{n+1}^l = MAN(f_n^l, {V_j | j != l}) 1^T + f_n^l on real steps
                # ("shared": the same pass for every l).
                sequences = [
                    x + fused_l.unsqueeze(1) * mask.unsqueeze(-1)
                    for x, fused_l, mask in zip(sequences, passes, full_masks, strict=True)
                ]
        output = self.output(fused)
        if not details:
            return output
        return FusionOutput(output, sequences, attentions, [layer.last_mode for layer in self.layers])

    def _per_modality_passes(
        self,
        layer: MultiLinearAttentionLayer,
        sequences: list[Tensor],
        originals: list[Tensor],
        masks: list[Tensor],
        return_attention: bool,
    ) -> tuple[Tensor, Tensor | list[Tensor] | None]:
        """The m passes of one layer of MAN Eq. 13 in one call of ``layer``.

        Variant l (rows l B .. (l + 1) B - 1 of the stacked batch) holds modality l's
        current sequence and the original sequences of the others. Returns the pass
        outputs (m, B, hidden_dim) and, if asked, the attention averaged over the m
        passes (each a distribution, so their mean is one).
        """
        m, batch = len(sequences), sequences[0].shape[0]
        stacked = [
            torch.cat([sequences[j] if pass_of == j else originals[j] for pass_of in range(m)])
            for j in range(m)
        ]  # modality j: (m B, T_j, hidden_dim)
        stacked_masks = [mask.repeat(m, 1) for mask in masks]
        result = layer(stacked, stacked_masks, return_attention=return_attention)
        fused, attention = result if return_attention else (result, None)
        if attention is not None:
            if isinstance(attention, list):
                attention = [a.unflatten(0, (m, batch)).mean(0) for a in attention]
            else:
                attention = attention.unflatten(0, (m, batch)).mean(0)
        return fused.unflatten(0, (m, batch)), attention
