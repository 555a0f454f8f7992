"""The rows of ``polyfuse bench peers``: each builds a peer's module from its checkout
(imported unchanged), loads the same weights into the polyfuse counterpart and returns
both as callables on the same inputs.

Peers and what is taken from them (nothing of theirs is copied into polyfuse):

* ``man``: github.com/wangzih98/MAN (unofficial MAN), ``model_performer_multihead.LMF``.
  Its modality subnetworks (two per-step MLPs and an LSTM) are replaced on the built
  instance by ``nn.Identity`` so that both sides compute the fusion layer alone
  (polyfuse's MAN has no subnetworks). The file imports ``IPython`` (for ``embed``,
  never called) and builds its parameters with ``.cuda()``: ``IPython`` is replaced by
  an empty module while importing when it is not installed, ``Tensor.cuda`` returns
  the tensor itself while the module is built when torch has no CUDA, and the global
  ``middle2`` that its constructor reads but the file never defines is set on the
  imported module to the constructor's ``rank2``. Row ``man`` has the peer's forward
  call its own kernel function with ``is_query=False, eps=0`` (see :func:`_exact_kernel`);
  row ``man_published`` keeps the published arguments, with which the outputs differ.
* ``ban-vqa``: github.com/jnhwkim/ban-vqa, ``attention.BiAttention``, ``bc.BCNet`` and
  ``fc.FCNet`` composed as ``BanModel.forward`` composes them, without the word
  embedding, question GRU and counter: the fusion path, loaded into polyfuse by
  :func:`polyfuse.interop.load_ban_fusion`.
* ``multibench``: github.com/pliang279/MultiBench, ``fusions.common_fusions``
  (``TensorFusion``, ``LowRankTensorFusion``) and ``unimodals.common_models``
  (``Linear``, ``MLP``), composed as its ``MMDL`` composes encoders, fusion and head.
  ``common_models`` imports torchvision (for its VGG encoders, not used here); it is
  replaced by an empty module while importing when it is not installed.

Every row is built on the CPU, whatever the device (while a peer's modules are built,
``Tensor.cuda`` returns the tensor itself and ``torch.cuda.is_available()`` is False, so
the weights are the same on every machine), then moved to the device with its inputs
(:meth:`Pair.to`). Where a peer's code fails on a device, the smallest change that makes
it run is applied to the source text as it is imported, never to the checkout, and the
row lists it (:data:`CUDA_PATCHES`): on CUDA, ban-vqa's ``BiAttention.forward_all``
reshapes its logits with ``view``, which a non-contiguous einsum result there refuses.

Weight layouts differ in one systematic way besides names: the peers put the constant
1 first (``[1, z]``), polyfuse last (``[z, 1]``, :func:`polyfuse.functional.append_one`),
so TFN's fused entries are a permutation of each other and LMF's factors are rolled by
one row.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import math
import sys
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["CUDA_PATCHES", "ROWS", "Pair", "RowSpec", "build_pair", "built_on_cpu", "describe_patch", "peer_modules",
           "tfn_permutation"]


@dataclass
class Pair:
    """Both sides of one row on the same weights.

    ``ours`` and ``theirs`` take the row's inputs (a list of tensors) and return one
    tensor; ``align`` maps the peer's output onto polyfuse's layout before the outputs
    are compared (None: the same layout); ``modules`` are put in eval mode.
    """

    ours: Callable[[Sequence[Tensor]], Tensor]
    theirs: Callable[[Sequence[Tensor]], Tensor]
    inputs: list[Tensor]
    modules: list[nn.Module] = field(default_factory=list)
    align: Callable[[Tensor], Tensor] | None = None
    #: weights held outside any module's parameters (a peer's plain list of factors,
    #: parameters captured by a closure): moved with the modules.
    loose: list[Tensor] = field(default_factory=list)
    #: the run-time source patches applied to the peer's code, as text for the report.
    patches: list[str] = field(default_factory=list)

    def to(self, device: torch.device) -> Pair:
        """Move the modules, the loose weights (in place: closures keep seeing them) and
        the inputs to ``device``; returns ``self``."""
        for module in self.modules:
            module.to(device)
        for tensor in self.loose:
            moved = tensor.detach().to(device)
            if isinstance(tensor, nn.Parameter):
                moved = nn.Parameter(moved, requires_grad=tensor.requires_grad)
            torch.utils.swap_tensors(tensor, moved)  # the same Python object, now on device
        self.inputs = [x.to(device) for x in self.inputs]
        return self


@dataclass(frozen=True)
class RowSpec:
    """One configuration: its peer (``man``, ``ban_vqa`` or ``multibench``), sizes and
    builder. ``build(root, sizes, seed, device)`` builds both sides on the CPU; ``device``
    only selects the source patches the peer needs there (:data:`CUDA_PATCHES`)."""

    name: str
    peer: str
    description: str
    sizes: dict[str, Any]
    build: Callable[[Path, dict[str, Any], int, torch.device], Pair]


# ---------------------------------------------------------------------------
# Importing a peer's modules unchanged
# ---------------------------------------------------------------------------


def _stub(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def _missing(name: str) -> bool:
    if name in sys.modules:
        return False
    return importlib.util.find_spec(name) is None


def _inside(module: types.ModuleType | None, root: Path) -> bool:
    """Whether ``module`` was loaded from a file under ``root``."""
    path = getattr(module, "__file__", None)
    return path is not None and Path(path).resolve().is_relative_to(root.resolve())


#: A run-time source patch: (module name, text in the peer's file, its replacement).
SourcePatch = tuple[str, str, str]

#: The patches a peer needs on CUDA, by peer. ban-vqa's ``BiAttention.forward_all``
#: flattens its logits with ``view``; on CUDA the einsum that makes them returns a
#: non-contiguous tensor, which ``view`` refuses ("view size is not compatible with
#: input tensor's size and stride"), and ``reshape`` copies it (the same values).
CUDA_PATCHES: dict[str, list[SourcePatch]] = {
    "ban_vqa": [("attention", "logits.view(-1, self.glimpse, v_num * q_num)",
                 "logits.reshape(-1, self.glimpse, v_num * q_num)")],
}


def describe_patch(patch: SourcePatch) -> str:
    """One line for the report: ``attention.py: `old` -> `new```."""
    module, old, new = patch
    return f"{module.replace('.', '/')}.py: `{old}` -> `{new}`"


def _import_patched(root: Path, name: str, patches: Sequence[SourcePatch]) -> types.ModuleType:
    """Import module ``name`` of the checkout from its source text with ``patches``
    applied (each old text must occur exactly once); the file is only read."""
    spec = importlib.machinery.PathFinder.find_spec(name, [str(root)])
    if spec is None or spec.origin is None or not _inside_path(spec.origin, root):
        raise ImportError(f"cannot patch {name}: no {name.replace('.', '/')}.py in {root}")
    source = Path(spec.origin).read_text(encoding="utf-8")
    for _, old, new in patches:
        count = source.count(old)
        if count != 1:
            raise ImportError(f"the run-time patch {describe_patch((name, old, new))} does not apply to "
                              f"{spec.origin}: the old text occurs {count} times (expected once)")
        source = source.replace(old, new)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)  # the peer's own code, patched in memory
    return module


def _inside_path(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


@contextlib.contextmanager
def peer_modules(root: Path, names: Sequence[str], stubs: dict[str, types.ModuleType] | None = None,
                 patches: Sequence[SourcePatch] = ()) -> Iterator[dict[str, types.ModuleType]]:
    """Import ``names`` from the checkout ``root`` (first on ``sys.path``), with
    ``stubs`` standing in for modules that are not installed and ``patches`` applied to
    the source text of the modules they name (:func:`_import_patched`; the checkout is
    not written). On exit ``sys.path`` is as before and ``sys.modules`` holds none of the
    peer's modules and stubs (the peers' generic names, ``fc`` or ``utils``, must not
    leak into other imports; what torch imported meanwhile stays); the imported objects
    stay usable. No bytecode is written into the checkout."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no checkout at {root}")
    saved_path, saved_modules = list(sys.path), dict(sys.modules)
    saved_bytecode = sys.dont_write_bytecode
    sys.path.insert(0, str(root))
    sys.dont_write_bytecode = True
    for name, module in (stubs or {}).items():
        if _missing(name):
            sys.modules[name] = module
    by_module: dict[str, list[SourcePatch]] = {}
    for patch in patches:
        by_module.setdefault(patch[0], []).append(patch)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, module_patches in by_module.items():
                _import_patched(root, name, module_patches)
            yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path[:] = saved_path
        sys.dont_write_bytecode = saved_bytecode
        for name, module in list(sys.modules.items()):
            if name not in saved_modules and (name in (stubs or {}) or _inside(module, root)):
                del sys.modules[name]
        sys.modules.update(saved_modules)


@contextlib.contextmanager
def built_on_cpu() -> Iterator[None]:
    """While a row is built: ``Tensor.cuda`` returns the tensor itself (a peer that
    hard-codes ``.cuda()``) and ``torch.cuda.is_available()`` is False (a peer that puts
    its weights on ``cuda:0`` when it can), so that both sides are built on the CPU with
    the same weights on every machine; :meth:`Pair.to` moves them afterwards."""
    original_cuda, original_available = torch.Tensor.cuda, torch.cuda.is_available
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.Tensor.cuda = original_cuda  # type: ignore[method-assign]
        torch.cuda.is_available = original_available


def build_pair(spec: RowSpec, root: Path, sizes: dict[str, Any], seed: int, device: torch.device) -> Pair:
    """Build the row on the CPU (:func:`built_on_cpu`), with the source patches its peer
    needs on ``device``, and move it to ``device``."""
    with built_on_cpu():
        pair = spec.build(root, sizes, seed, device)
    return pair.to(device)


def _patches(peer: str, device: torch.device) -> list[SourcePatch]:
    return list(CUDA_PATCHES.get(peer, [])) if device.type == "cuda" else []


def _perturb(module: nn.Module, generator: torch.Generator, scale: float = 0.1) -> None:
    """Add seeded noise to every parameter, so that zero biases and unit gains of a
    fresh initialisation cannot hide a wrong mapping."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def _randn(generator: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=generator)


# ---------------------------------------------------------------------------
# MAN vs wangzih98/MAN
# ---------------------------------------------------------------------------


def _exact_kernel(source: types.ModuleType) -> None:
    """Make the peer's forward call its own ``softmax_kernel`` with ``is_query=False`` and
    ``eps=0``: one max over the whole batch instead of one per step (a constant, which
    cancels between Eq. 10 and Eq. 12, papers' note 5), and no added 1e-4. As
    published (``is_query=True``, ``eps=1e-4``) the per-step max weights each step by
    exp(-max_h w_h . a_t), which changes the attention, so no exact implementation can
    match it. The cost is the same: the same operations on tensors of the same shapes."""
    published = source.softmax_kernel

    def kernel(data: Tensor, **options: Any) -> Tensor:
        return published(data, **(options | {"is_query": False, "eps": 0.0}))

    source.softmax_kernel = kernel


def _build_man(root: Path, sizes: dict[str, Any], seed: int, device: torch.device) -> Pair:
    from polyfuse.nn.man import MAN

    dims, length, batch = sizes["input_dims"], sizes["length"], sizes["batch"]
    value_dim, feature_dim, out_dim = sizes["value_dim"], sizes["feature_dim"], sizes["out_dim"]
    stubs = {"IPython": _stub("IPython", embed=lambda *a, **k: None)}
    torch.manual_seed(seed)  # the peer draws its weights and projection from the global generator
    with peer_modules(root, ["model_performer_multihead"], stubs, _patches("man", device)) as modules:
        source = modules["model_performer_multihead"]
        # Its constructor reads a global ``middle2`` that the file never defines (the
        # argument is ``rank2``): supplied here with the same value.
        source.middle2 = feature_dim
        if sizes.get("exact_kernel"):
            _exact_kernel(source)
        peer = source.LMF(
            tuple(dims), (length,) * 3, (dims[0], dims[1], 8), dims[2], (0.0, 0.0, 0.0, 0.0),
            out_dim, value_dim, feature_dim)
    heads = peer.num_head
    # The fusion alone: the peer's subnetworks become identities (see the module doc).
    peer.audio_subnet, peer.video_subnet, peer.text_subnet = nn.Identity(), nn.Identity(), nn.Identity()
    generator = torch.Generator().manual_seed(seed)
    _perturb(peer, generator)
    ours = MAN(list(dims), out_dim, hidden_dim=heads * value_dim, heads=heads, attention_dim=feature_dim,
               num_random_features=peer.projection_matrix.shape[0], chunks=0, mode="had",
               estimator="arf", residual=False)
    layer = ours.layers[0]
    with torch.no_grad():
        # [1, h] @ fm = h @ fm[1:] + fm[0]: the peer's row 0 is polyfuse's bias.
        for j, name in enumerate(("a", "v", "t")):
            values, features = getattr(peer, f"{name}_fm1"), getattr(peer, f"{name}_fm2")
            # polyfuse's joint map: U'_j's rows, then U''_j's. The peer scales its features by
            # K'^(-1/4) on both sides of the kernel, i.e. logits a_j . a_k / sqrt(K'):
            # polyfuse's default temperature 1 / sqrt(K').
            layer.projections[j].weight.copy_(torch.cat([values[1:].T, features[1:].T]))
            layer.projections[j].bias.copy_(torch.cat([values[0], features[0]]))
        layer.pooling.copy_(torch.eye(value_dim).expand(heads, value_dim, value_dim))  # no pooling
        layer.random_matrix.copy_(peer.projection_matrix.expand_as(layer.random_matrix))  # shared by heads
        ours.output.weight.copy_(peer.out_weights.T)
        ours.output.bias.zero_()
    inputs = [_randn(generator, batch, length, d) for d in dims]
    return Pair(lambda x: ours(list(x)), lambda x: peer(*x), inputs, [ours, peer],
                patches=[describe_patch(p) for p in _patches("man", device)])


# ---------------------------------------------------------------------------
# BAN vs jnhwkim/ban-vqa
# ---------------------------------------------------------------------------


class _BanFusionPath(nn.Module):
    """ban-vqa's modules under BanModel's names (``v_att``, ``b_net``, ``q_prj``), run
    as ``BanModel.forward`` runs them without the counter: the glimpse loop, then the
    sum over the question tokens."""

    def __init__(self, v_att: nn.Module, b_net: list[nn.Module], q_prj: list[nn.Module]) -> None:
        super().__init__()
        self.v_att, self.b_net, self.q_prj = v_att, nn.ModuleList(b_net), nn.ModuleList(q_prj)

    def forward(self, v: Tensor, q_emb: Tensor) -> Tensor:
        att, _ = self.v_att.forward_all(v, q_emb)  # (B, G, objects, words)
        for g, (b_net, q_prj) in enumerate(zip(self.b_net, self.q_prj, strict=True)):
            joint = b_net.forward_with_weights(v, q_emb, att[:, g, :, :])
            q_emb = q_prj(joint.unsqueeze(1)) + q_emb
        return q_emb.sum(1)


def _build_ban(root: Path, sizes: dict[str, Any], seed: int, device: torch.device) -> Pair:
    from polyfuse.interop import load_ban_fusion

    v_dim, hidden, glimpses = sizes["image_dim"], sizes["hidden_dim"], sizes["glimpses"]
    torch.manual_seed(seed)
    patches = _patches("ban_vqa", device)
    with peer_modules(root, ["attention", "bc", "fc"], patches=patches) as modules:
        v_att = modules["attention"].BiAttention(v_dim, hidden, hidden, glimpses)
        b_net = [modules["bc"].BCNet(v_dim, hidden, hidden, None, k=1) for _ in range(glimpses)]
        q_prj = [modules["fc"].FCNet([hidden, hidden], "", 0.2) for _ in range(glimpses)]
    peer = _BanFusionPath(v_att, b_net, q_prj)
    generator = torch.Generator().manual_seed(seed)
    _perturb(peer, generator, scale=0.02)
    ours = load_ban_fusion(peer.state_dict())
    inputs = [_randn(generator, sizes["batch"], sizes["objects"], v_dim).relu(),
              _randn(generator, sizes["batch"], sizes["words"], hidden)]
    return Pair(lambda x: ours(list(x)), lambda x: peer(*x), inputs, [ours, peer],
                patches=[describe_patch(p) for p in patches])


# ---------------------------------------------------------------------------
# TFN and LMF vs pliang279/MultiBench
# ---------------------------------------------------------------------------


def tfn_permutation(hidden_dims: Sequence[int]) -> Tensor:
    """Index ``p`` with ``ours = theirs[:, p]``: polyfuse's tensor fusion of ``[z_j, 1]``
    (entry (i_1, ..., i_m) row-major) from MultiBench's of ``[1, z_j]``, whose entry for
    the same product is (i_1 + 1 mod (h_1 + 1), ...)."""
    grids = torch.meshgrid(*[torch.arange(h + 1) for h in hidden_dims], indexing="ij")
    flat = torch.zeros_like(grids[0])
    for h, index in zip(hidden_dims, grids, strict=True):
        flat = flat * (h + 1) + (index + 1) % (h + 1)
    return flat.reshape(-1)


def _multibench(root: Path, device: torch.device) -> Any:
    stubs = {"torchvision": _stub("torchvision", models=_stub("torchvision.models"))}
    return peer_modules(root, ["fusions.common_fusions", "unimodals.common_models"], stubs,
                        _patches("multibench", device))


def _multibench_patches(device: torch.device) -> list[str]:
    return [describe_patch(p) for p in _patches("multibench", device)]


class _MultiBenchModel(nn.Module):
    """Encoders, fusion and head in turn, as MultiBench's ``MMDL`` (without padding)."""

    def __init__(self, encoders: list[nn.Module], fusion: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoders, self.fusion, self.head = nn.ModuleList(encoders), fusion, head

    def forward(self, inputs: Sequence[Tensor]) -> Tensor:
        return self.head(self.fusion([encode(x) for encode, x in zip(self.encoders, inputs, strict=True)]))


def _build_tfn(root: Path, sizes: dict[str, Any], seed: int, device: torch.device) -> Pair:
    from polyfuse.nn.baselines import TFN

    dims, hidden, post = sizes["input_dims"], sizes["hidden_dims"], sizes["post_fusion_dim"]
    torch.manual_seed(seed)
    with _multibench(root, device) as modules:
        fusions, models = modules["fusions.common_fusions"], modules["unimodals.common_models"]
        fused_size = math.prod(h + 1 for h in hidden)
        peer = _MultiBenchModel(
            [nn.Sequential(models.Linear(d, h), nn.ReLU()) for d, h in zip(dims, hidden, strict=True)],
            fusions.TensorFusion(), models.MLP(fused_size, post, sizes["out_dim"]))
    generator = torch.Generator().manual_seed(seed)
    _perturb(peer, generator)
    ours = TFN(list(dims), sizes["out_dim"], subnetworks="light", hidden_dims=list(hidden),
               post_fusion_dim=post, post_fusion_layers=1)
    permutation = tfn_permutation(hidden)
    with torch.no_grad():
        for subnetwork, encoder in zip(ours.subnetworks, peer.encoders, strict=True):
            subnetwork.layers[0].weight.copy_(encoder[0].fc.weight)
            subnetwork.layers[0].bias.copy_(encoder[0].fc.bias)
        first, last = ours.post_fusion[1], ours.post_fusion[3]
        first.weight.copy_(peer.head.fc.weight[:, permutation])
        first.bias.copy_(peer.head.fc.bias)
        last.weight.copy_(peer.head.fc2.weight)
        last.bias.copy_(peer.head.fc2.bias)
    inputs = [_randn(generator, sizes["batch"], d) for d in dims]
    return Pair(lambda x: ours(list(x)), lambda x: peer(list(x)), inputs, [ours, peer],
                patches=_multibench_patches(device))


def _build_tensor_fusion(root: Path, sizes: dict[str, Any], seed: int, device: torch.device) -> Pair:
    from polyfuse.functional.tensor_fusion import tensor_fusion

    with _multibench(root, device) as modules:
        peer = modules["fusions.common_fusions"].TensorFusion()
    generator = torch.Generator().manual_seed(seed)
    permutation = tfn_permutation(sizes["hidden_dims"])
    inputs = [_randn(generator, sizes["batch"], h) for h in sizes["hidden_dims"]]
    return Pair(lambda x: tensor_fusion(list(x)), lambda x: peer(list(x)), inputs, [peer],
                align=lambda out: out[:, permutation.to(out.device)], patches=_multibench_patches(device))


def _lmf_pair(root: Path, sizes: dict[str, Any], seed: int, device: torch.device
              ) -> tuple[nn.Module, list[Tensor], list[Tensor], Tensor, Tensor]:
    """The peer's LowRankTensorFusion, polyfuse's factors, rank weights and bias from it, and inputs."""
    dims, out_dim, rank = sizes["input_dims"], sizes["out_dim"], sizes["rank"]
    torch.manual_seed(seed)
    with _multibench(root, device) as modules:
        peer = modules["fusions.common_fusions"].LowRankTensorFusion(list(dims), out_dim, rank)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # its factors are a plain list, not registered parameters
        for factor in [*peer.factors, peer.fusion_weights, peer.fusion_bias]:
            factor.add_(0.1 * torch.randn(factor.shape, generator=generator))
    # [1, z] W = [z, 1] roll(W): the peer's row 0 (the constant's) becomes the last.
    factors = [factor.detach().roll(-1, dims=1) for factor in peer.factors]
    inputs = [_randn(generator, sizes["batch"], d) for d in dims]
    return peer, factors, inputs, peer.fusion_weights.detach()[0], peer.fusion_bias.detach()[0]


def _peer_loose(peer: nn.Module) -> list[Tensor]:
    """MultiBench's LowRankTensorFusion keeps its factors in a plain list (not
    registered): they move with the row as loose weights."""
    return list(peer.factors)


def _build_lmf(root: Path, sizes: dict[str, Any], seed: int, device: torch.device) -> Pair:
    from polyfuse.nn.baselines import LMF

    peer, factors, inputs, rank_weights, bias = _lmf_pair(root, sizes, seed, device)
    ours = LMF(list(sizes["input_dims"]), sizes["out_dim"], rank=sizes["rank"], subnetworks="light")
    with torch.no_grad():
        for target, factor in zip(ours.factors, factors, strict=True):
            target.copy_(factor)
        ours.rank_weights.copy_(rank_weights)
        ours.bias.copy_(bias)
    return Pair(lambda x: ours(list(x)), lambda x: peer(list(x)), inputs, [ours, peer],
                loose=_peer_loose(peer), patches=_multibench_patches(device))


def _build_low_rank_fusion(root: Path, sizes: dict[str, Any], seed: int, device: torch.device) -> Pair:
    from polyfuse.functional.tensor_fusion import low_rank_fusion

    peer, factors, inputs, rank_weights, bias = _lmf_pair(root, sizes, seed, device)
    factors = [nn.Parameter(f) for f in factors]
    rank_weights, bias = nn.Parameter(rank_weights.clone()), nn.Parameter(bias.clone())
    return Pair(lambda x: low_rank_fusion(list(x), factors, rank_weights, bias=bias),
                lambda x: peer(list(x)), inputs, [peer],
                loose=[*factors, rank_weights, bias, *_peer_loose(peer)], patches=_multibench_patches(device))


# MOSI-like MAN layer: hidden 40 (4 heads, the peer's fixed count, of 10 values), K' = 12
# and the peer's 2 K' = 24 random features, three modalities of 50 steps, batch 32.
_MAN = {"input_dims": (40, 40, 40), "length": 50, "batch": 32, "value_dim": 10, "feature_dim": 12, "out_dim": 1}
_BAN_VQA = {"image_dim": 2048, "hidden_dim": 1024, "glimpses": 8, "objects": 36, "words": 14, "batch": 32}
_BAN_SMALL = {**_BAN_VQA, "image_dim": 128, "hidden_dim": 64}
# MultiBench's affect examples: affect_tf.py (encoders to 4, 19, 79; head MLP(8000, 512, 1))
# and affect_lrf.py (LowRankTensorFusion([32, 32, 128], 128, 32)); MOSI input sizes 35, 74, 300.
_TFN = {"input_dims": (35, 74, 300), "hidden_dims": (4, 19, 79), "post_fusion_dim": 512, "out_dim": 1, "batch": 32}
_LMF = {"input_dims": (32, 32, 128), "out_dim": 128, "rank": 32, "batch": 32}

ROWS: dict[str, RowSpec] = {spec.name: spec for spec in [
    RowSpec("man", "man", "MAN layer (had, 3 x 50 steps of 40, 4 heads, H = 24, batch 32) vs wangzih98/MAN, "
            "its kernel with one max per batch and no eps", {**_MAN, "exact_kernel": True}, _build_man),
    RowSpec("man_published", "man", "the same, the peer's kernel as published (per-step max, eps 1e-4): "
            "outputs differ, not timed", _MAN, _build_man),
    RowSpec("ban_vqa", "ban_vqa", "BAN fusion, VQA size (2048/1024, 8 glimpses, 36 x 14, batch 32) vs ban-vqa",
            _BAN_VQA, _build_ban),
    RowSpec("ban_small", "ban_vqa", "BAN fusion, small (128/64, 8 glimpses, 36 x 14, batch 32) vs ban-vqa",
            _BAN_SMALL, _build_ban),
    RowSpec("tfn", "multibench", "TFN module (light subnetworks to 4/19/79, head 512, batch 32) vs MultiBench",
            _TFN, _build_tfn),
    RowSpec("tensor_fusion", "multibench", "tensor_fusion alone (4/19/79, batch 32) vs MultiBench TensorFusion",
            _TFN, _build_tensor_fusion),
    RowSpec("lmf", "multibench", "LMF module (32/32/128 to 128, rank 32, batch 32) vs MultiBench",
            _LMF, _build_lmf),
    RowSpec("low_rank_fusion", "multibench",
            "low_rank_fusion alone (32/32/128 to 128, rank 32, batch 32) vs MultiBench LowRankTensorFusion",
            _LMF, _build_low_rank_fusion),
]}
