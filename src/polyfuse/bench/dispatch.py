"""``polyfuse bench ops``: how many ATen operations one forward (and backward) dispatches.

On a GPU each dispatched operation is (at least) one kernel launch with a few
microseconds of host work, so a module whose forward dispatches hundreds of small
operations is launch-bound: the device waits for the host. The count is
deterministic and device-independent (the same operations reach the CUDA kernels),
so it is measured here on the CPU with a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
that sees every operation after autograd, i.e. as the backend executes it:
composite operations appear decomposed (``F.linear`` of a 3-d input is
``t`` + ``view`` + ``addmm`` + ``view`` ...), views and in-place operations count
like any other, and the backward's operations are seen too.

The sizes (docs/BENCHMARKS.md, "Operations dispatched"): registry defaults, ``out_dim=8``, batch 8, three modalities
of feature sizes 300 / 74 / 35 and lengths 20 / 30 / 25 (modules of two modalities
take the first two), each sample padded at random (its real length drawn uniformly
from [1, T], seeded), validation at its default level, after one warm-up call of each
pass (what a module builds once and keeps is not counted). The forward is counted in eval
mode under ``torch.no_grad``; the forward+backward in eval mode (no dropout draws) as
the operations of ``module(inputs, masks).sum().backward()`` with inputs that require
gradients, i.e. the gradients of the output's sum with respect to the inputs and the
parameters as training computes them (accumulating into ``.grad``, which starts empty:
one ``detach`` per leaf).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import polyfuse.nn
from polyfuse.bench.results import result_header

__all__ = [
    "DispatchCounter",
    "OpsSettings",
    "count_module_operations",
    "count_operations",
    "ops_inputs",
    "ops_markdown",
    "read_baseline",
    "run_ops_bench",
    "source_commit",
]


class DispatchCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched inside its ``with`` block.

    ``counter.total`` is the number of operations; ``counter.by_name`` a
    :class:`collections.Counter` of their overload packet names (``"aten.addmm"``).
    Operations on every thread that the mode reaches (the autograd engine's CPU work
    runs on the calling thread) are counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.by_name[str(func.overloadpacket).replace("aten::", "aten.")] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_name.values())


def count_operations(function: Callable[[], Any]) -> DispatchCounter:
    """Call ``function()`` under a :class:`DispatchCounter` and return the counter."""
    with DispatchCounter() as counter:
        function()
    return counter


@dataclass(frozen=True)
class OpsSettings:
    """The sizes at which operations are counted (those of docs/BENCHMARKS.md by default)."""

    batch: int = 8
    dims: tuple[int, ...] = (300, 74, 35)
    lengths: tuple[int, ...] = (20, 30, 25)
    out_dim: int = 8
    seed: int = 0
    top: int = 8  # most frequent operation names kept per module and pass

    def __post_init__(self) -> None:
        if len(self.dims) != len(self.lengths) or len(self.dims) < 2:
            raise ValueError(f"OpsSettings: dims {self.dims} and lengths {self.lengths} must pair up, at least 2")
        for name in ("batch", "out_dim", "top"):
            if getattr(self, name) < 1:
                raise ValueError(f"OpsSettings: {name} must be >= 1, got {getattr(self, name)}")
        if min(self.dims) < 1 or min(self.lengths) < 1:
            raise ValueError(f"OpsSettings: dims and lengths must be >= 1, got {self.dims}, {self.lengths}")


def ops_inputs(settings: OpsSettings, count: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``count`` float32 inputs (B, T_j, d_j) ~ N(0, 1) and (B, T_j) masks whose real
    lengths are drawn uniformly from [1, T_j], from a generator seeded with ``settings.seed``."""
    generator = torch.Generator().manual_seed(settings.seed)
    inputs, masks = [], []
    for length, dim in zip(settings.lengths[:count], settings.dims[:count], strict=True):
        inputs.append(torch.randn(settings.batch, length, dim, generator=generator))
        real = torch.randint(1, length + 1, (settings.batch, 1), generator=generator)
        masks.append(torch.arange(length)[None, :] < real)
    return inputs, masks


def count_module_operations(
    module: torch.nn.Module, inputs: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> tuple[DispatchCounter, DispatchCounter]:
    """(forward, forward+backward) counters of ``module`` in eval mode, see the module docstring.

    The module is put in eval mode and left there.
    """
    module.eval()

    def forward() -> None:
        with torch.no_grad():
            module(list(inputs), list(masks))

    leaves = [x.detach().requires_grad_(True) for x in inputs]

    def forward_backward() -> None:
        module(leaves, list(masks)).sum().backward()

    forward()  # one warm-up call of each: what a module builds once and keeps (MAN's
    forward_backward()  # step segments, its weight columns) is not counted, as in training
    module.zero_grad(set_to_none=True)  # the first accumulation into .grad: the same ops every time
    for leaf in leaves:
        leaf.grad = None
    counts = count_operations(forward), count_operations(forward_backward)
    module.zero_grad(set_to_none=True)
    return counts


def source_commit() -> str | None:
    """The short commit of the polyfuse source being run, "+dirty" when src/ has
    uncommitted changes; None outside a git checkout."""
    source = Path(__file__).resolve().parents[1]  # src/polyfuse
    try:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def _top(counter: DispatchCounter, top: int) -> list[list[Any]]:
    return [[name, count] for name, count in counter.by_name.most_common(top)]


def run_ops_bench(
    names: Sequence[str] | None = None,
    settings: OpsSettings | None = None,
    *,
    baseline: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Count the operations of every registered fusion module (or ``names``).

    ``baseline``: an earlier ``ops`` result (e.g. of the code before a change) measured
    at the same settings; each module it has gets its counts and commit beside the
    new ones (row key ``baseline``).
    """
    from polyfuse._checks import get_validation

    settings = settings or OpsSettings()
    before = _baseline_rows(baseline, settings) if baseline is not None else {}
    rows = []
    for name in names or polyfuse.nn.available():
        cls = polyfuse.nn.get(name)
        count = len(settings.dims)
        if cls.max_modalities is not None:
            count = min(count, cls.max_modalities)
        torch.manual_seed(settings.seed)
        module = polyfuse.nn.create(name, input_dims=list(settings.dims[:count]), out_dim=settings.out_dim)
        inputs, masks = ops_inputs(settings, count)
        forward, forward_backward = count_module_operations(module, inputs, masks)
        rows.append({
            "module": name,
            "modalities": count,
            "forward": forward.total,
            "forward_backward": forward_backward.total,
            "forward_top": _top(forward, settings.top),
            "forward_backward_top": _top(forward_backward, settings.top),
        })
        if name in before:
            rows[-1]["baseline"] = before[name]
        if progress:
            progress(f"{name}: {forward.total} operations forward, {forward_backward.total} forward+backward")
    recorded = {**asdict(settings), "validation": get_validation(), "torch": torch.__version__,
                "commit": source_commit()}
    return {**result_header("ops", recorded), "rows": rows}


def _baseline_rows(baseline: dict[str, Any], settings: OpsSettings) -> dict[str, dict[str, Any]]:
    """{module: {"commit", "forward", "forward_backward"}} of an earlier ``ops`` result,
    which must have been counted at the same sizes."""
    if baseline.get("benchmark") != "ops":
        raise ValueError(f"the baseline is a {baseline.get('benchmark')!r} result, not an 'ops' one")
    theirs = baseline["settings"]
    for key, value in asdict(settings).items():
        if key == "top":
            continue
        recorded = theirs.get(key)
        if (tuple(recorded) if isinstance(recorded, list) else recorded) != value:
            raise ValueError(f"the baseline was counted with {key}={recorded!r}, this run with {value!r}")
    commit = theirs.get("commit") or "unknown"
    return {row["module"]: {"commit": commit, "forward": row["forward"],
                            "forward_backward": row["forward_backward"]} for row in baseline["rows"]}


def read_baseline(path: str | Path) -> dict[str, Any]:
    """An ``ops`` result JSON file, for ``run_ops_bench(baseline=...)``."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


_VALIDATION_NOTE = {"auto": " (values checked, as `full`: the inputs are on the CPU)"}


def ops_markdown(payload: dict[str, Any], output_dir: str = "docs/benchmarks") -> list[str]:
    """The section of docs/BENCHMARKS.md for an ``ops`` result (a list of lines).

    A row may carry ``baseline`` = {"commit", "forward", "forward_backward"}: the counts
    of the same module before a change, shown beside the current ones.
    """
    settings = payload["settings"]
    command = "polyfuse bench ops"
    if settings.get("baseline_file"):
        command += f" --baseline {settings['baseline_file']}"
    command += f" --output-dir {output_dir}"
    dims = " / ".join(map(str, settings["dims"]))
    lengths = " / ".join(map(str, settings["lengths"]))
    lines = [
        "## Operations dispatched per forward and per forward+backward", "",
        f"`{command}`. ATen operations counted by a `TorchDispatchMode` "
        "(`polyfuse.bench.dispatch.DispatchCounter`, after autograd: composite operations "
        "decomposed, views included); on a GPU each is at least one kernel launch, so the "
        "count bounds how launch-bound a small batch is. Registry defaults, "
        f"`out_dim={settings['out_dim']}`, batch {settings['batch']}, inputs of sizes {dims} "
        f"and lengths {lengths} (two-modality modules take the first two), each sample "
        f"a random real length in [1, T] (seed {settings['seed']}), validation "
        f"`{settings['validation']}`{_VALIDATION_NOTE.get(settings['validation'], '')}, "
        f"torch {settings['torch']}, polyfuse at commit "
        f"{settings.get('commit') or 'unknown'}. Forward: eval mode, "
        "`torch.no_grad`; forward+backward: eval mode, "
        "`module(inputs, masks).sum().backward()` with inputs that require gradients and "
        "empty `.grad` (one `detach` per leaf). The counts are "
        "deterministic (the tests guard some of them). MAN's registry default is `mode=\"auto\"`, "
        "which computes exact attention at these sizes (4 heads x 20 x 30 x 25 = 60,000 tuples per "
        "sample <= 2^16); its had mode, counted by `tests/nn/test_man.py`, takes at most 249 / 613 "
        "operations with the LSC part exact (the default) and 194 / 410 with it estimated. BAN's "
        "counts are those of the device measured: on the CPU it runs its glimpses one by one also "
        "without dropout (faster there, issue 40: `polyfuse.nn.ban.chain_on`), on CUDA the batched "
        "chain, which `tests/nn/test_ban.py` counts and guards (160 / 558 at these sizes).", "",
        "| module | forward | forward+backward | most frequent, forward | most frequent, forward+backward |",
        "|---|---:|---:|---|---|",
    ]
    for row in payload["rows"]:
        def top(pairs: list[list[Any]]) -> str:
            return ", ".join(f"{name.removeprefix('aten.')} {count}" for name, count in pairs[:5])
        lines.append(f"| {row['module']} | {row['forward']:,} | {row['forward_backward']:,} "
                     f"| {top(row['forward_top'])} | {top(row['forward_backward_top'])} |")
    baselines = [row for row in payload["rows"] if row.get("baseline")]
    if baselines:
        lines += ["", "Before and after (the same count at the baseline commit):", "",
                  "| module | baseline commit | forward before | after | forward+backward before | after |",
                  "|---|---|---:|---:|---:|---:|"]
        for row in baselines:
            base = row["baseline"]
            lines.append(f"| {row['module']} | {base['commit']} | {base['forward']:,} | {row['forward']:,} "
                         f"| {base['forward_backward']:,} | {row['forward_backward']:,} |")
    return [*lines, ""]
