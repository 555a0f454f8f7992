"""``polyfuse bench peers``: polyfuse against the public implementations, side by side
in one process, on the same weights.

For every row of :data:`polyfuse.bench.peer_rows.ROWS` whose peer checkout was given:

1. the peer's modules are imported unchanged from the checkout and built with a fixed
   seed; its weights are mapped onto the polyfuse counterpart (see ``peer_rows``);
2. both run once on the same inputs (eval mode, float32, no gradient) and the largest
   absolute difference of the outputs is recorded; a row whose difference is above
   ``tolerance * max(1, max |peer output|)`` is **not timed** (unless ``time_unequal``),
   since a faster wrong answer means nothing;
3. at each thread count, forward (under ``torch.no_grad``) and forward+backward (the
   sum of the output, inputs requiring gradients, parameters accumulating theirs) are
   timed in interleaved rounds (polyfuse, peer, polyfuse, peer, ...); the ratio
   polyfuse / peer is taken within each round and summarised by its median and
   quartiles (:func:`polyfuse.bench.measure.paired_ratio`): below 1 polyfuse is faster.

Both sides run in eval mode (dropout off) also for forward+backward, so that the two
compute the same function. A row is skipped with a note when its checkout is missing or
its import or construction fails. The machine's load during each row is recorded.

On CUDA (``device="cuda"``) both sides are built on the CPU with the same weights and
moved to the GPU (:func:`~polyfuse.bench.peer_rows.build_pair`); each call is timed by
CUDA events after a synchronisation (:func:`~polyfuse.bench.measure.cuda_event_seconds`),
still in interleaved rounds; the source patches a peer needs there are applied as its
code is imported (never to the checkout) and listed in the row (``patches``).
``batch_sizes`` runs every row at each batch size in turn instead of its own.
"""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from polyfuse.bench.measure import (
    LoadMonitor,
    bench_device,
    call_timer,
    count_flops,
    paired_ratio,
    time_interleaved_samples,
)
from polyfuse.bench.peer_rows import ROWS, Pair, RowSpec, build_pair
from polyfuse.bench.results import result_header

__all__ = ["PEER_REPOSITORIES", "format_table", "markdown_report", "peer_commit", "run_peers"]

PEER_REPOSITORIES = {"man": "wangzih98/MAN", "ban_vqa": "jnhwkim/ban-vqa", "multibench": "pliang279/MultiBench"}
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


def _time_pair(pair: Pair, threads: Sequence[int], warmup: int, repeats: int,
               device: torch.device) -> dict[str, Any]:
    timings: dict[str, Any] = {}
    previous = torch.get_num_threads()
    timer = call_timer(device)
    try:
        for count in threads:
            torch.set_num_threads(count)
            per_pass = {}
            for name, wrap in (("forward", _forward), ("forward_backward", _forward_backward)):
                fns = {"polyfuse": wrap(pair.ours, pair.inputs), "peer": wrap(pair.theirs, pair.inputs)}
                with LoadMonitor() as load:
                    samples = time_interleaved_samples(fns, warmup=warmup, repeats=repeats, timer=timer)
                per_pass[name] = _timing(samples) | {"load": load.result()}
            timings[str(count)] = per_pass
    finally:
        torch.set_num_threads(previous)
    return timings


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


def _run_row(spec: RowSpec, root: Path, sizes: dict[str, Any], *, threads: Sequence[int], warmup: int,
             repeats: int, tolerance: float, time_unequal: bool, profile: int, seed: int,
             device: torch.device) -> dict[str, Any]:
    row: dict[str, Any] = {"name": spec.name, "peer": spec.peer, "description": spec.description,
                           "sizes": sizes, "batch": sizes.get("batch")}
    try:  # any failure of the peer's code (import, construction, forward) skips the row
        pair = build_pair(spec, root, sizes, seed, device)
        row["patches"] = pair.patches
        for module in pair.modules:
            module.eval()
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
    row["timings"] = _time_pair(pair, threads, warmup, repeats, device)
    if profile:
        row["profile"] = _profile(pair, profile, min(threads))
    return row


def run_peers(
    paths: dict[str, Path | None],
    *,
    rows: Sequence[str] | None = None,
    threads: Sequence[int] = (1, 2),
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
    row's own); see the module doc. ``specs`` replaces the rows (tests). Returns the JSON
    payload: header, settings, peers (path, commit) and rows."""
    device = bench_device(device)
    if profile and device.type == "cuda":
        raise ValueError("--profile records CPU operators only: run it with --device cpu")
    if batch_sizes is not None and (not batch_sizes or any(b < 1 for b in batch_sizes)):
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    specs = ROWS if specs is None else specs
    names = list(specs) if rows is None else list(rows)
    unknown = [name for name in names if name not in specs]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; choose from {', '.join(specs)}")
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
                results.append(_run_row(spec, Path(path), sizes, threads=threads, warmup=warmup, repeats=repeats,
                                        tolerance=tolerance, time_unequal=time_unequal, profile=profile,
                                        seed=seed, device=device))
            if progress is not None:
                progress(_row_line(results[-1]))
    settings = {"device": str(device), "timer": "cuda events" if device.type == "cuda" else "perf_counter",
                "threads": list(threads), "interop_threads": torch.get_num_interop_threads(),
                "batch_sizes": None if batch_sizes is None else [int(b) for b in batch_sizes],
                "warmup": warmup, "repeats": repeats, "tolerance": tolerance, "time_unequal": time_unequal,
                "seed": seed, "mode": "eval, float32"}
    payload = result_header("peers", settings, device)
    payload |= {"peers": peers, "rows": results}
    return payload


def _ratio_text(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.2f} [{ratio['first_quartile']:.2f}, {ratio['third_quartile']:.2f}]"


def _row_line(row: dict[str, Any]) -> str:
    label = f"{row['name']} (batch {row['batch']})" if row.get("batch") is not None else row["name"]
    if row["status"] in ("skipped", "refused"):
        return f"{label}: {row['status']}: {row['note']}"
    parts = [f"{label}: max |diff| {row['max_abs_difference']:.2g}"]
    for count, passes in row["timings"].items():
        parts.append(f"{count} thr fwd {_ratio_text(passes['forward']['ratio'])} "
                     f"fwd+bwd {_ratio_text(passes['forward_backward']['ratio'])}")
    return "; ".join(parts)


def format_table(payload: dict[str, Any]) -> str:
    """A Markdown table of the ratios (polyfuse / peer, median [quartiles]) and medians."""
    lines = ["| row | threads | batch | max abs diff | forward ratio | fwd+bwd ratio | polyfuse fwd ms | peer fwd ms "
             "| polyfuse fwd+bwd ms | peer fwd+bwd ms | fwd MFLOP polyfuse / peer | polyfuse fwd GFLOP/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for row in payload["rows"]:
        batch = row.get("batch", row.get("sizes", {}).get("batch", "-"))
        for patch in row.get("patches", []):
            notes.append(f"- {row['name']} (batch {batch}): run-time patch of the peer's code: {patch}")
        if row["status"] in ("skipped", "refused"):
            diff = f"{row['max_abs_difference']:.2g}" if "max_abs_difference" in row else "-"
            lines.append(f"| {row['name']} | - | {batch} | {diff} | {row['status']} | | | | | | | |")
            notes.append(f"- {row['name']} (batch {batch}): {row['note']}")
            continue
        flag = " (outputs differ)" if row["status"] == "timed_unequal" else ""
        flops = row.get("forward_flops", {})
        ours_flops, peer_flops = flops.get("polyfuse"), flops.get("peer")
        flop_text = "-" if ours_flops is None else f"{ours_flops / 1e6:.4g} / {peer_flops / 1e6:.4g}"
        for count, passes in row["timings"].items():
            fwd, both = passes["forward"], passes["forward_backward"]
            rate = "-" if not ours_flops else f"{ours_flops / fwd['polyfuse']['median_s'] / 1e9:.3g}"
            lines.append(
                f"| {row['name']}{flag} | {count} | {batch} | {row['max_abs_difference']:.2g} | {_ratio_text(fwd['ratio'])} "
                f"| {_ratio_text(both['ratio'])} | {1e3 * fwd['polyfuse']['median_s']:.3f} "
                f"| {1e3 * fwd['peer']['median_s']:.3f} | {1e3 * both['polyfuse']['median_s']:.3f} "
                f"| {1e3 * both['peer']['median_s']:.3f} | {flop_text} | {rate} |")
    return "\n".join(lines + (["", *notes] if notes else []))


def _gpu_text(machine: dict[str, Any]) -> str:
    if "gpu" not in machine:
        return ""
    return (f"{machine['gpu']} ({machine['gpu_memory_bytes'] / 2**30:.0f} GiB, CUDA {machine.get('cuda')}, "
            f"cuDNN {machine.get('cudnn')}) with ")


def _loads(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [passes[name]["load"] for row in payload["rows"] for passes in row.get("timings", {}).values()
            for name in ("forward", "forward_backward")]


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
             "weights and inputs, checks that the outputs agree (largest absolute difference below; a row "
             "beyond the tolerance is not timed), then times forward (`torch.no_grad`) and "
             f"forward+backward in interleaved rounds, both in eval mode, float32; {timing}**Ratio = polyfuse time / "
             "peer time** per round, median [first, third quartile] over "
             f"{settings['repeats']} rounds after {settings['warmup']} warm-up rounds: below 1 polyfuse is "
             "faster. Milliseconds are medians. The last two columns: the matrix-product FLOPs of one "
             "forward of each side as torch's `FlopCounterMode` counts them, and polyfuse's forward rate "
             "(those FLOPs over its median time). Where the counts are equal both sides run the same "
             "products, so a ratio well below 1 needs the same kernels to run faster.", "",
             f"Machine: {_gpu_text(machine)}{machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']}, "
             f"Python {machine['python']}; thread counts {settings['threads']} (intra-op, set in turn), "
             f"{settings['interop_threads']} inter-op; measured {payload['created']} (polyfuse "
             f"{payload['polyfuse']}).", ""]
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
