"""``polyfuse bench peers``: polyfuse against the public implementations, side by side
in one process, on the same weights.

For every row of :data:`polyfuse.bench.peer_rows.ROWS` whose peer checkout was given:

1. the peer's modules are imported unchanged from the checkout and built with a fixed
   seed; its weights are mapped onto the polyfuse counterpart (see ``peer_rows``);
2. both run once on the same inputs (eval mode, float32, no gradient) and the largest
   absolute difference of the outputs is recorded; a row whose difference is above
   ``tolerance * max(1, max |peer output|)`` is **not timed** (unless ``time_unequal``),
   since a faster wrong answer means nothing;
3. at each thread count and in each mode (``eval``: ``.eval()`` on every module of the
   pair, dropout off, the function whose outputs were compared; ``train``: ``.train()``
   on every module, dropout on and its cost included), forward (under
   ``torch.no_grad``) and forward+backward (the sum of the output, inputs requiring
   gradients, parameters accumulating theirs) are timed in interleaved rounds
   (polyfuse, peer, polyfuse, peer, ...); the ratio polyfuse / peer is taken within
   each round and summarised by its median and quartiles
   (:func:`polyfuse.bench.measure.paired_ratio`): below 1 polyfuse is faster. The
   outputs are compared in eval mode only: in train mode dropout makes them random;
4. for the rows asked (``memory``), the peak memory of one forward+backward of each
   side (:func:`_peak_memory`).

``timings[threads][mode][pass]`` holds the result, ``pass`` in ``forward``,
``forward_backward``. A row is skipped with a note when its checkout is missing or its
import or construction fails. The machine's load during each row is recorded.
:func:`compare_to_baseline` holds a new result against an earlier one (``polyfuse bench
peers --against``): the guard against a regression.

On CUDA (``device="cuda"``) both sides are built on the CPU with the same weights and
moved to the GPU (:func:`~polyfuse.bench.peer_rows.build_pair`); each call is timed by
CUDA events after a synchronisation (:func:`~polyfuse.bench.measure.cuda_event_seconds`),
still in interleaved rounds; the source patches a peer needs there are applied as its
code is imported (never to the checkout) and listed in the row (``patches``).
``batch_sizes`` runs every row at each batch size in turn instead of its own.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from polyfuse.bench.dispatch import source_commit
from polyfuse.bench.measure import (
    LoadMonitor,
    bench_device,
    call_timer,
    count_flops,
    paired_ratio,
    peak_memory_bytes,
    time_interleaved_samples,
)
from polyfuse.bench.peer_rows import ROWS, Pair, RowSpec, build_pair
from polyfuse.bench.results import result_header

__all__ = ["MODES", "PASSES", "PEER_REPOSITORIES", "Change", "compare_to_baseline", "format_changes", "format_table",
           "markdown_report", "peer_commit", "read_peers_result", "run_peers"]

PEER_REPOSITORIES = {"man": "wangzih98/MAN", "ban_vqa": "jnhwkim/ban-vqa", "multibench": "pliang279/MultiBench"}
#: The modes a row is timed in (``module.eval()`` / ``module.train()``) and the passes timed in each.
MODES = ("eval", "train")
PASSES = ("forward", "forward_backward")
Progress = Callable[[str], None] | None


def peer_commit(path: Path) -> str | None:
    """The checked-out commit of a git work tree, else the one in a ``PEER_COMMIT`` file
    beside a copy of its files (``scripts/gpu_session.sh --stage-peers`` writes it), else
    None (not a git checkout, no git)."""
    recorded = Path(path) / "PEER_COMMIT"
    if not (Path(path) / ".git").exists() and recorded.is_file():
        return recorded.read_text(encoding="utf-8").strip() or None
    try:
        result = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=False, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def _output(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value
    return value[0]  # (output, attention) pairs


def _compare(pair: Pair) -> tuple[float, float]:
    """Largest |ours - peer| and largest |peer| over one forward on the row's inputs."""
    with torch.no_grad():
        ours = _output(pair.ours(pair.inputs)).float()
        theirs = _output(pair.theirs(pair.inputs)).float()
    if pair.align is not None:
        theirs = pair.align(theirs)
    if ours.shape != theirs.shape:
        raise ValueError(f"outputs have shapes {tuple(ours.shape)} (polyfuse) and {tuple(theirs.shape)} (peer)")
    return (ours - theirs).abs().max().item(), theirs.abs().max().item()


def _forward(function: Callable[[Sequence[Tensor]], Any], inputs: list[Tensor]) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            function(inputs)

    return run


def _forward_backward(function: Callable[[Sequence[Tensor]], Any], inputs: list[Tensor]) -> Callable[[], None]:
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]

    def run() -> None:
        _output(function(leaves)).sum().backward()
        for leaf in leaves:
            leaf.grad = None

    return run


def _timing(samples: dict[str, list[float]]) -> dict[str, Any]:
    summary = {name: {"median_s": statistics.median(values), "samples_s": values}
               for name, values in samples.items()}
    return {"ratio": paired_ratio(samples, "polyfuse", "peer"), **summary}


def _set_mode(pair: Pair, mode: str) -> None:
    """``.train()`` (mode ``train``) or ``.eval()`` on every module of the pair."""
    for module in pair.modules:
        module.train(mode == "train")


def _time_pair(pair: Pair, threads: Sequence[int], modes: Sequence[str], warmup: int, repeats: int,
               device: torch.device) -> dict[str, Any]:
    """``{threads: {mode: {pass: timing}}}``; the pair is left in eval mode."""
    timings: dict[str, Any] = {}
    previous = torch.get_num_threads()
    timer = call_timer(device)
    try:
        for count in threads:
            torch.set_num_threads(count)
            per_mode: dict[str, Any] = {}
            for mode in modes:
                _set_mode(pair, mode)
                per_pass = {}
                for name, wrap in zip(PASSES, (_forward, _forward_backward), strict=True):
                    fns = {"polyfuse": wrap(pair.ours, pair.inputs), "peer": wrap(pair.theirs, pair.inputs)}
                    with LoadMonitor() as load:
                        samples = time_interleaved_samples(fns, warmup=warmup, repeats=repeats, timer=timer)
                    per_pass[name] = _timing(samples) | {"load": load.result()}
                per_mode[mode] = per_pass
            timings[str(count)] = per_mode
    finally:
        torch.set_num_threads(previous)
        _set_mode(pair, "eval")
    return timings


def _peak_memory(pair: Pair, device: torch.device) -> dict[str, float | None]:
    """Peak memory of one forward+backward of each side, in eval mode, in MiB, and the
    ratio polyfuse / peer.

    What is counted: the high-water mark of the bytes allocated through PyTorch's
    allocator during the call, above the level at its start
    (:func:`polyfuse.bench.measure.peak_memory_bytes`: on the CPU from ``torch.profiler``'s
    allocation events, on CUDA ``torch.cuda.max_memory_allocated`` after
    ``reset_peak_memory_stats``). That is the activations saved for backward, the
    temporaries and the gradients (the parameters' are cleared first, so they are
    allocated in the call, as in a training step after ``zero_grad()``); not the weights
    and inputs, which exist before the call, nor what MKL or oneDNN allocate themselves.
    It is measured after the timing, which has run both sides (a side's first call may
    allocate once what later calls reuse); then the count is the same at every run for
    the same shapes, so that a change of the ratio is a change of the code, not noise.
    The resident size of the process
    (``ru_maxrss``) was not used: it is a high-water mark over the whole process, so it
    needs a fresh process per side, and it adds one-off costs (libraries loaded,
    thread pools, first-call caches) and the C allocator's retention, which vary from
    run to run."""
    _set_mode(pair, "eval")
    weights = [*pair.loose, *(p for module in pair.modules for p in module.parameters())]
    mebibytes: dict[str, float | None] = {}
    for side, function in (("polyfuse", pair.ours), ("peer", pair.theirs)):
        for weight in weights:
            weight.grad = None
        peak = peak_memory_bytes(_forward_backward(function, pair.inputs), device)
        mebibytes[side] = None if peak is None else peak / 2**20
    ours, theirs = mebibytes["polyfuse"], mebibytes["peer"]
    return {"polyfuse_mib": ours, "peer_mib": theirs,
            "ratio": None if ours is None or not theirs else ours / theirs}


def _profile(pair: Pair, top: int, threads: int) -> dict[str, list[dict[str, Any]]]:
    """Top ``top`` operators by self CPU time per pass (mean of 3) of forward and
    forward+backward per side, at ``threads`` intra-op threads."""
    from polyfuse.bench.measure import quiet_stderr

    result: dict[str, Any] = {"threads": threads}
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result |= _profile_sides(pair, top, quiet_stderr)
    finally:
        torch.set_num_threads(previous)
    return result


def _profile_sides(pair: Pair, top: int, quiet: Any) -> dict[str, list[dict[str, Any]]]:
    result: dict[str, list[dict[str, Any]]] = {}
    for side, function in (("polyfuse", pair.ours), ("peer", pair.theirs)):
        for name, wrap in (("forward", _forward), ("forward_backward", _forward_backward)):
            call = wrap(function, pair.inputs)
            call()  # warm-up outside the profile
            with quiet(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    call()
            events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
            total = sum(e.self_cpu_time_total for e in events) or 1.0
            result[f"{side}_{name}"] = [
                {"op": e.key, "calls_per_pass": e.count / 3, "self_ms_per_pass": e.self_cpu_time_total / 3e3,
                 "share": e.self_cpu_time_total / total}
                for e in events[:top]
            ]
    return result


def _run_row(spec: RowSpec, root: Path, sizes: dict[str, Any], *, threads: Sequence[int], modes: Sequence[str],
             warmup: int, repeats: int, tolerance: float, time_unequal: bool, profile: int, memory: bool,
             seed: int, device: torch.device) -> dict[str, Any]:
    row: dict[str, Any] = {"name": spec.name, "peer": spec.peer, "description": spec.description,
                           "sizes": sizes, "batch": sizes.get("batch")}
    try:  # any failure of the peer's code (import, construction, forward) skips the row
        pair = build_pair(spec, root, sizes, seed, device)
        row["patches"] = pair.patches
        _set_mode(pair, "eval")
        difference, scale = _compare(pair)
    except Exception as error:
        row |= {"status": "skipped", "note": f"could not build or run the row with the checkout {root}: "
                f"{type(error).__name__}: {error}"}
        return row
    limit = tolerance * max(1.0, scale)
    row |= {"max_abs_difference": difference, "max_abs_peer_output": scale, "tolerance": limit,
            "equal": difference <= limit}
    if not row["equal"] and not time_unequal:
        row |= {"status": "refused", "note": f"outputs differ by {difference:.3g} (> {limit:.3g}): not timed"}
        return row
    row["status"] = "timed" if row["equal"] else "timed_unequal"
    # The matrix-product FLOPs of one forward of each side (FlopCounterMode): equal counts mean
    # the same products, so the ratio can only come from how fast the same kernels run.
    row["forward_flops"] = {"polyfuse": count_flops(_forward(pair.ours, pair.inputs)),
                            "peer": count_flops(_forward(pair.theirs, pair.inputs))}
    row["timings"] = _time_pair(pair, threads, modes, warmup, repeats, device)
    if memory:
        row["memory"] = _peak_memory(pair, device)
    if profile:
        row["profile"] = _profile(pair, profile, min(threads))
    return row


def run_peers(
    paths: dict[str, Path | None],
    *,
    rows: Sequence[str] | None = None,
    threads: Sequence[int] = (1, 2),
    modes: Sequence[str] = MODES,
    memory: Sequence[str] = (),
    warmup: int = 3,
    repeats: int = 15,
    tolerance: float = 1e-5,
    time_unequal: bool = False,
    profile: int = 0,
    seed: int = 0,
    progress: Progress = None,
    specs: dict[str, RowSpec] | None = None,
    device: str | torch.device = "cpu",
    batch_sizes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Run the rows (default all) whose peer has a path in ``paths`` (keys ``man``,
    ``ban_vqa``, ``multibench``) on ``device``, at each of ``batch_sizes`` (None: each
    row's own), timed in each of ``modes``; the rows named in ``memory`` (those of them
    that are run and timed) also get their peak memory. See the module doc. ``specs``
    replaces the rows (tests). Returns the JSON payload: header, settings, peers (path,
    commit) and rows."""
    device = bench_device(device)
    if profile and device.type == "cuda":
        raise ValueError("--profile records CPU operators only: run it with --device cpu")
    if batch_sizes is not None and (not batch_sizes or any(b < 1 for b in batch_sizes)):
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    specs = ROWS if specs is None else specs
    names = list(specs) if rows is None else list(rows)
    unknown = [name for name in [*names, *memory] if name not in specs]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; choose from {', '.join(specs)}")
    if not modes or len(set(modes)) < len(modes) or any(mode not in MODES for mode in modes):
        raise ValueError(f"modes must be distinct, of {', '.join(MODES)}; got {list(modes)}")
    if not threads or any(count < 1 for count in threads):
        raise ValueError(f"thread counts must be >= 1, got {list(threads)}")
    peers = {}
    for key, path in paths.items():
        present = path is not None and Path(path).is_dir()
        peers[key] = {"repository": PEER_REPOSITORIES.get(key, key), "path": None if path is None else str(path),
                      "present": present, "commit": peer_commit(Path(path)) if present else None}
    results = []
    for name in names:
        spec = specs[name]
        path = paths.get(spec.peer)
        for batch in [None] if batch_sizes is None else batch_sizes:
            sizes = spec.sizes if batch is None else {**spec.sizes, "batch": int(batch)}
            if path is None or not Path(path).is_dir():
                note = (f"no checkout of {PEER_REPOSITORIES.get(spec.peer, spec.peer)} given" if path is None
                        else f"no checkout at {path}")
                results.append({"name": name, "peer": spec.peer, "description": spec.description,
                                "sizes": sizes, "batch": sizes.get("batch"), "status": "skipped", "note": note})
            else:
                results.append(_run_row(spec, Path(path), sizes, threads=threads, modes=modes, warmup=warmup,
                                        repeats=repeats, tolerance=tolerance, time_unequal=time_unequal,
                                        profile=profile, memory=name in memory, seed=seed, device=device))
            if progress is not None:
                progress(_row_line(results[-1]))
    settings = {"device": str(device), "timer": "cuda events" if device.type == "cuda" else "perf_counter",
                "threads": list(threads), "modes": list(modes), "dtype": "float32", "memory_rows": list(memory),
                "interop_threads": torch.get_num_interop_threads(),
                "batch_sizes": None if batch_sizes is None else [int(b) for b in batch_sizes],
                "warmup": warmup, "repeats": repeats, "tolerance": tolerance, "time_unequal": time_unequal,
                "seed": seed}
    payload = result_header("peers", settings, device)
    payload |= {"commit": source_commit(), "peers": peers, "rows": results}
    return payload


def _ratio_text(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.2f} [{ratio['first_quartile']:.2f}, {ratio['third_quartile']:.2f}]"


def _row_line(row: dict[str, Any]) -> str:
    label = f"{row['name']} (batch {row['batch']})" if row.get("batch") is not None else row["name"]
    if row["status"] in ("skipped", "refused"):
        return f"{label}: {row['status']}: {row['note']}"
    parts = [f"{label}: max |diff| {row['max_abs_difference']:.2g}"]
    for count, modes in row["timings"].items():
        for mode, passes in modes.items():
            parts.append(f"{count} thr {mode} fwd {_ratio_text(passes['forward']['ratio'])} "
                         f"fwd+bwd {_ratio_text(passes['forward_backward']['ratio'])}")
    if "memory" in row:
        memory = row["memory"]
        parts.append(f"peak memory {_number(memory['polyfuse_mib'], '.1f')} / {_number(memory['peer_mib'], '.1f')} "
                     f"MiB (ratio {_number(memory['ratio'], '.2f')})")
    return "; ".join(parts)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(payload: dict[str, Any]) -> str:
    """A Markdown table of the ratios (polyfuse / peer, median [quartiles]) and medians, one
    line per row, thread count and mode, then one of the peak memory of the rows that have it."""
    lines = ["| row | threads | batch | mode | max abs diff | forward ratio | fwd+bwd ratio | polyfuse fwd ms "
             "| peer fwd ms | polyfuse fwd+bwd ms | peer fwd+bwd ms | fwd MFLOP polyfuse / peer "
             "| polyfuse fwd GFLOP/s |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for row in payload["rows"]:
        batch = row.get("batch", row.get("sizes", {}).get("batch", "-"))
        for patch in row.get("patches", []):
            notes.append(f"- {row['name']} (batch {batch}): run-time patch of the peer's code: {patch}")
        if row["status"] in ("skipped", "refused"):
            diff = f"{row['max_abs_difference']:.2g}" if "max_abs_difference" in row else "-"
            lines.append(f"| {row['name']} | - | {batch} | - | {diff} | {row['status']} | | | | | | | |")
            notes.append(f"- {row['name']} (batch {batch}): {row['note']}")
            continue
        flag = " (outputs differ)" if row["status"] == "timed_unequal" else ""
        flops = row.get("forward_flops", {})
        ours_flops, peer_flops = flops.get("polyfuse"), flops.get("peer")
        flop_text = "-" if ours_flops is None else f"{ours_flops / 1e6:.4g} / {peer_flops / 1e6:.4g}"
        for count, modes in row["timings"].items():
            for mode, passes in modes.items():
                fwd, both = passes["forward"], passes["forward_backward"]
                rate = "-" if not ours_flops else f"{ours_flops / fwd['polyfuse']['median_s'] / 1e9:.3g}"
                lines.append(
                    f"| {row['name']}{flag} | {count} | {batch} | {mode} | {row['max_abs_difference']:.2g} "
                    f"| {_ratio_text(fwd['ratio'])} | {_ratio_text(both['ratio'])} "
                    f"| {1e3 * fwd['polyfuse']['median_s']:.3f} | {1e3 * fwd['peer']['median_s']:.3f} "
                    f"| {1e3 * both['polyfuse']['median_s']:.3f} | {1e3 * both['peer']['median_s']:.3f} "
                    f"| {flop_text} | {rate} |")
    return "\n".join(lines + _memory_table(payload) + (["", *notes] if notes else []))


def _memory_table(payload: dict[str, Any]) -> list[str]:
    rows = [row for row in payload["rows"] if "memory" in row]
    if not rows:
        return []
    lines = ["", "Peak memory of one forward+backward (eval mode):", "",
             "| row | batch | polyfuse MiB | peer MiB | ratio |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        memory = row["memory"]
        lines.append(f"| {row['name']} | {row.get('batch', '-')} | {_number(memory['polyfuse_mib'], '.1f')} "
                     f"| {_number(memory['peer_mib'], '.1f')} | {_number(memory['ratio'], '.2f')} |")
    return lines


_MODE_TEXT = {"eval": "in eval mode (`.eval()` on every module of the pair: dropout off, the function whose "
                      "outputs were compared)",
              "train": "in train mode (`.train()` on every module of the pair: dropout on, its cost included; "
                       "the outputs, random then, are not compared)"}


def _modes_text(modes: Sequence[str]) -> str:
    return " and ".join(_MODE_TEXT[mode] for mode in modes)


def _gpu_text(machine: dict[str, Any]) -> str:
    if "gpu" not in machine:
        return ""
    return (f"{machine['gpu']} ({machine['gpu_memory_bytes'] / 2**30:.0f} GiB, CUDA {machine.get('cuda')}, "
            f"cuDNN {machine.get('cudnn')}) with ")


def _loads(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [passes[name]["load"] for row in payload["rows"] for modes in row.get("timings", {}).values()
            for passes in modes.values() for name in PASSES]


def markdown_report(payload: dict[str, Any], command: str) -> str:
    """The section of docs/BENCHMARKS.md for one run (written as ``peers.md``)."""
    machine, settings = payload["machine"], payload["settings"]
    loads = _loads(payload)
    on_gpu = settings.get("device", "cpu").startswith("cuda")
    title = (f"## Peers on the GPU ({machine.get('gpu', 'CUDA')}): polyfuse against the public implementations"
             if on_gpu else "## Peers: polyfuse against the public implementations")
    timing = ("each call timed by CUDA events after a `torch.cuda.synchronize()` (the device's time from "
              "the call's first kernel to its last, launch gaps included); both sides built on the CPU "
              "with the same weights, then moved to the GPU. " if on_gpu else "")
    lines = [title, "",
             f"`{command}`", "",
             "Each row imports the peer's modules from its checkout (unchanged, but for the run-time "
             "patches listed under the table), gives both sides the same "
             "weights and inputs, checks that the outputs agree in eval mode (largest absolute difference below; "
             "a row beyond the tolerance is not timed), then times forward (`torch.no_grad`) and "
             f"forward+backward in interleaved rounds, float32, {_modes_text(settings['modes'])}; "
             f"{timing}**Ratio = polyfuse time / "
             "peer time** per round, median [first, third quartile] over "
             f"{settings['repeats']} rounds after {settings['warmup']} warm-up rounds: below 1 polyfuse is "
             "faster. Milliseconds are medians. The last two columns: the matrix-product FLOPs of one "
             "forward of each side as torch's `FlopCounterMode` counts them, and polyfuse's forward rate "
             "(those FLOPs over its median time). Where the counts are equal both sides run the same "
             "products, so a ratio well below 1 needs the same kernels to run faster.", ""]
    if any("memory" in row for row in payload["rows"]):
        allocator = "`torch.cuda.max_memory_allocated`" if on_gpu else "`torch.profiler`'s allocation events"
        lines += ["Peak memory (the table after the timings, for the rows given to `--memory`, by default "
                  "`ban_vqa ban_small`): one forward+backward of each side in eval mode, the parameters' "
                  "gradients cleared first, as in a training step after `zero_grad()`; the high-water mark of "
                  "the bytes allocated through PyTorch's allocator during the call, above the level at its "
                  f"start ({allocator}): the activations saved for backward, the temporaries and the gradients, "
                  "not the weights and inputs, nor what MKL or oneDNN allocate themselves. The count is the "
                  "same at every run for the same shapes. Ratio = polyfuse / peer: below 1 polyfuse needs "
                  "less.", ""]
    lines += ["**The guard against a regression:** `polyfuse bench peers --man PATH/MAN --ban-vqa PATH/ban-vqa "
              "--multibench PATH/MultiBench --against BASELINE.json` (the JSON of a run like this one: "
              "`docs/benchmarks/peers.json` on the CPU) measures the baseline's rows, batch sizes, thread "
              "counts, modes and memory rows again, prints each ratio beside the baseline's and exits with "
              "status 1 when one, of time or memory, is more than 15% worse (new / old > 1.15) or crosses 1.0 "
              "(old <= 1.0 < new); a ratio missing on one side is reported, not a failure. `--against OLD.json "
              "--result NEW.json` compares two results without measuring.", "",
              f"Machine: {_gpu_text(machine)}{machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']}, "
              f"Python {machine['python']}; thread counts {settings['threads']} (intra-op, set in turn), "
              f"{settings['interop_threads']} inter-op; measured {payload['created']} (polyfuse "
              f"{payload['polyfuse']}, commit {payload.get('commit') or 'unknown'}).", ""]
    if loads:
        busy = [load["machine_busy"] for load in loads if load.get("machine_busy") is not None]
        others = [load["others"] for load in loads if load.get("others") is not None]
        averages = [load["loadavg_1min"] for load in loads]
        high = max(averages) > machine["logical_cpus"] or (others and max(others) > 0.25)
        if high:
            lines += ["**The machine was heavily loaded by other processes during this run** (1-minute load "
                      f"average {min(averages):.1f} to {max(averages):.1f} on {machine['logical_cpus']} CPUs"
                      + (f", other processes took up to {100 * max(others):.0f}% of all CPU time" if others else "")
                      + "): the ratios, taken within rounds under the same load, are indicative only; "
                      "rerun on a quiet machine for claims.", ""]
        elif busy:
            lines += [f"Load: machine busy {100 * min(busy):.0f}% to {100 * max(busy):.0f}% of all CPUs, "
                      f"1-minute load average up to {max(averages):.1f}.", ""]
    lines += ["The peers are git checkouts given by path; the rows say what of each is run, and "
              "`src/polyfuse/bench/peer_rows.py` how its weights are mapped and what had to be worked around "
              "to import it (a missing module stubbed, a global its constructor reads but never defines, "
              "`.cuda()` while it is built, on the CPU). Row `man` calls the peer's own kernel function with one max per "
              "batch instead of one per step and without its `eps = 1e-4` (same operations, same cost): as "
              "published (`man_published`) the per-step max reweights the attention, so no exact "
              "implementation matches it.", ""]
    lines += ["| peer | repository | commit |", "|---|---|---|"]
    for key, peer in payload["peers"].items():
        commit = peer["commit"] or ("not a git checkout" if peer["present"] else "not given")
        lines.append(f"| {key} | github.com/{peer['repository']} | {commit} |")
    lines += ["", "| row | what |", "|---|---|"]
    lines += [f"| {row['name']} | {row['description']} |" for row in payload["rows"]]
    lines += ["", format_table(payload), ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------
# The guard: a result against a baseline
# ---------------------------------------------------------------------------


def read_peers_result(path: str | Path) -> dict[str, Any]:
    """A ``peers`` result JSON file of the current format (timings by thread count, mode
    and pass); an older one, or another benchmark's, is refused with a ValueError."""
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    if not isinstance(payload, dict) or payload.get("benchmark") != "peers":
        found = payload.get("benchmark") if isinstance(payload, dict) else None
        raise ValueError(f"{path} is not a 'peers' result (benchmark {found!r})")
    if "modes" not in payload.get("settings", {}):
        raise ValueError(f"{path} was measured before train mode was timed (its timings have no mode level): "
                         "measure a new one with this version of polyfuse bench peers")
    return payload


@dataclass(frozen=True)
class Change:
    """One ratio polyfuse / peer in the baseline (``old``) and now (``new``): a time
    (``threads``, ``mode``, ``measure`` ``forward`` or ``forward_backward``) or the peak
    memory (``measure`` ``memory``, no threads or mode). ``old`` or ``new`` is None where
    that side lacks it; ``failed`` says whether it counts as a regression, ``reason`` why
    (or why a side lacks it)."""

    row: str
    threads: int | None
    mode: str | None
    measure: str
    old: float | None
    new: float | None
    failed: bool
    reason: str


def _row_label(row: dict[str, Any]) -> str:
    return row["name"] if row.get("batch") is None else f"{row['name']} b{row['batch']}"


def _ratios(row: dict[str, Any] | None) -> dict[tuple[int | None, str | None, str], float]:
    """The row's median time ratios by (threads, mode, pass) and its memory ratio."""
    if row is None:
        return {}
    ratios = {(int(count), mode, name): timing["ratio"]["median"]
              for count, modes in row.get("timings", {}).items()
              for mode, passes in modes.items() for name, timing in passes.items()}
    memory = row.get("memory", {}).get("ratio")
    if memory is not None:
        ratios[(None, None, "memory")] = memory
    return ratios


def _absence(row: dict[str, Any] | None, side: str) -> str:
    if row is None:
        return f"row not {side}"
    if row["status"] in ("skipped", "refused"):
        return f"{row['status']} {side}: {row['note']}"
    return f"not measured {side}"


def _judge(old: float | None, new: float | None, old_row: dict[str, Any] | None, new_row: dict[str, Any] | None,
           tolerance: float) -> tuple[bool, str]:
    """(failed, reason) of one ratio: see :func:`compare_to_baseline`."""
    if old is None:
        return False, _absence(old_row, "in the baseline")
    if new_row is not None and new_row["status"] == "refused":
        return True, f"refused now: {new_row['note']}"
    if new is None:
        return False, _absence(new_row, "now")
    reasons = []
    if new / old > 1 + tolerance:
        reasons.append(f"more than {tolerance:.0%} worse")
    if old <= 1.0 < new:
        reasons.append("crossed 1.0")
    return bool(reasons), "; ".join(reasons)


def compare_to_baseline(payload: dict[str, Any], baseline: dict[str, Any], *,
                        tolerance: float = 0.15) -> list[Change]:
    """Every ratio of ``baseline`` and ``payload`` (both ``peers`` results), matched by
    row, batch, thread count, mode and pass (and the memory ratio): the baseline's order
    first, then what only ``payload`` has. A ratio fails when it is more than
    ``tolerance`` worse (new / old > 1 + tolerance) or crosses 1.0 (old <= 1.0 < new:
    polyfuse no longer faster, or smaller); so does every ratio of a row timed in the
    baseline whose outputs now differ from the peer's (refused). A ratio absent on one
    side is reported with the reason, not a failure."""
    old_rows = {_row_label(row): row for row in baseline["rows"]}
    new_rows = {_row_label(row): row for row in payload["rows"]}
    changes = []
    for label in [*old_rows, *(label for label in new_rows if label not in old_rows)]:
        old_row, new_row = old_rows.get(label), new_rows.get(label)
        old_ratios, new_ratios = _ratios(old_row), _ratios(new_row)
        for key in [*old_ratios, *(key for key in new_ratios if key not in old_ratios)]:
            old, new = old_ratios.get(key), new_ratios.get(key)
            failed, reason = _judge(old, new, old_row, new_row, tolerance)
            changes.append(Change(label, *key, old=old, new=new, failed=failed, reason=reason))
    return changes


_MEASURE_TEXT = {"forward": "fwd", "forward_backward": "fwd+bwd", "memory": "memory"}


def format_changes(changes: Sequence[Change]) -> list[str]:
    """One line per change: ``ban_vqa b32  t1 eval   fwd+bwd  0.79 -> 0.81  (+2.5%)``,
    then ``FAIL`` and the reason where it failed, or the reason a side lacks it."""
    width = max((len(change.row) for change in changes), default=0)
    lines = []
    for change in changes:
        where = "" if change.threads is None else f"t{change.threads} {change.mode}"
        old, new = _number(change.old, ".2f"), _number(change.new, ".2f")
        text = f"{change.row:<{width}}  {where:<8} {_MEASURE_TEXT[change.measure]:<8} {old} -> {new}"
        if change.old is not None and change.new is not None:
            text += f"  ({change.new / change.old - 1:+.1%})"
        if change.failed:
            text += f"  FAIL: {change.reason}"
        elif change.reason:
            text += f"  ({change.reason})"
        lines.append(text)
    return lines
