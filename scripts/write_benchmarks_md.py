#!/usr/bin/env python
"""Write docs/BENCHMARKS.md from the JSON results in docs/benchmarks/ (never by hand).

    python scripts/write_benchmarks_md.py [--results docs/benchmarks] [--output docs/BENCHMARKS.md]

The results come from ``polyfuse bench {targets,paper,complexity,approximation,ops,data}
--output-dir docs/benchmarks``; a missing result gets a line saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from polyfuse.bench.complexity import geometric_growth
from polyfuse.bench.data import data_markdown
from polyfuse.bench.dispatch import ops_markdown
from polyfuse.bench.results import format_bytes, read_results

ORDER = ("targets", "paper", "complexity", "approximation", "backbones", "ops", "data")
COMMANDS = {
    "targets": "polyfuse bench targets --output-dir docs/benchmarks",
    "paper": "polyfuse bench paper --output-dir docs/benchmarks",
    "complexity": "polyfuse bench complexity --output-dir docs/benchmarks",
    "approximation": "polyfuse bench approximation --output-dir docs/benchmarks",
    "backbones": "python scripts/bench_backbones.py --out docs/benchmarks/backbones.json",
    "ops": "polyfuse bench ops --output-dir docs/benchmarks",
    "data": "polyfuse bench data --output-dir docs/benchmarks",
}
TARGET_TEXT = {
    "exact_over_had": "exact / had forward time, MOSI configuration, m = 3, T = 50, batch 32",
    "modalities_8_over_2": "had forward time, m = 8 / m = 2 (MOSI configuration, T = 50, batch 32)",
    "length_400_over_50": "had forward time, T = 400 / T = 50 (MOSI configuration, m = 3, batch 32)",
    "had_flop_rate_fraction": (
        "had attention FLOP rate / 2048^3 float32 matmul rate (m = 7, T = 30, hidden 512, "
        "8 heads, H = 512, batch 32)"
    ),
}


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.2f}"


def _load(load: dict[str, Any] | None) -> str:
    if not load or load.get("machine_busy") is None:
        return "load not recorded"
    return (f"machine busy {100 * load['machine_busy']:.0f}% of all CPUs, this run "
            f"{100 * load['own']:.0f}%, other processes {100 * load['others']:.0f}%, "
            f"steal {100 * load['steal']:.0f}%, load average {load['loadavg_1min']:.2f}")


def _machine(payload: dict[str, Any]) -> str:
    machine = payload["machine"]
    return (f"{machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']} "
            f"with {machine['torch_threads']} threads, Python {machine['python']}; measured "
            f"{payload['created']} (polyfuse {payload['polyfuse']})")


def targets_section(payload: dict[str, Any]) -> list[str]:
    lines = ["## Speed targets", "",
             f"`{COMMANDS['targets']}`: each target is a ratio of two measurements taken in "
             "turns (a, b, a, b, ...) in one run, medians over "
             f"{payload['settings']['repeats']} repeats after {payload['settings']['warmup']} "
             "warm-up calls; forward passes in eval mode under `torch.no_grad`.", "",
             f"Machine: {_machine(payload)}.", ""]
    if not payload["settings"].get("issue_sizes", True):
        lines += ["**These are not the issue's sizes** (a `--quick` run that only exercises "
                  "the code); the verdicts below mean nothing.", ""]
    lines += ["| target | threshold | measured | verdict |", "|---|---:|---:|---|"]
    for name, target in payload["targets"].items():
        verdict = "**pass**" if target["passed"] else "**FAIL**"
        value = target["value"]
        shown = f"{100 * value:.1f}%" if name == "had_flop_rate_fraction" else f"{value:.2f}"
        threshold = (f"{target['direction']} {100 * target['threshold']:.0f}%"
                     if name == "had_flop_rate_fraction" else f"{target['direction']} {target['threshold']:g}")
        lines.append(f"| {TARGET_TEXT.get(name, name)} | {threshold} | {shown} | {verdict} |")
    t = payload["targets"]
    lines += ["", "The measurements behind the ratios (median ms):", ""]
    e = t["exact_over_had"]
    lines.append(f"- exact {_ms(e['exact_s']['median'])} ms, had {_ms(e['had_s']['median'])} ms "
                 f"({_load(payload['load']['exact_over_had'])}).")
    g = t["modalities_8_over_2"]
    lines.append(f"- had m = 2: {_ms(g['m2_s']['median'])} ms, m = 8: {_ms(g['m8_s']['median'])} ms "
                 f"({_load(payload['load']['modalities_8_over_2'])}).")
    g = t["length_400_over_50"]
    lines.append(f"- had T = 50: {_ms(g['T50_s']['median'])} ms, T = 400: {_ms(g['T400_s']['median'])} ms "
                 f"({_load(payload['load']['length_400_over_50'])}).")
    f = t["had_flop_rate_fraction"]
    lines.append(
        f"- 2048^3 matmul {_ms(f['matmul_s']['median'])} ms = {f['matmul_flop_rate'] / 1e9:.0f} GFLOP/s; "
        f"had attention {_ms(f['had_s']['median'])} ms for {f['had_flops_by_hand'] / 1e9:.3f} GFLOP "
        f"counted by hand (FlopCounterMode: {f['had_flops_counted'] / 1e9:.3f}, with the |a|^2/2 column) "
        f"= {f['had_flop_rate'] / 1e9:.0f} GFLOP/s; the whole MAN layer (projections included) "
        f"{_ms(f['man_layer_s']['median'])} ms, {100 * f['man_layer_flop_rate_fraction']:.0f}% of the "
        f"matmul rate ({_load(payload['load']['had_flop_rate_fraction'])}).")
    return [*lines, ""]


def paper_section(payload: dict[str, Any], folder: Path) -> list[str]:
    lines = ["## The MAN paper's CMU-MOSI figures beside ours", "",
             f"`{COMMANDS['paper']}`. One integration layer in the paper's configuration (hidden "
             "size 40, 10 heads, 24 random features, 4 LSC chunks, 3 modalities). The paper does "
             "not give the sequence length; we assume **T = 50** (MulT's word-aligned CMU-MOSI, "
             "the data of MAN's Transformer backbone) and show T = 20 too. FLOPs per sample, "
             "counted by `FlopCounterMode` (matrix products; 2 FLOPs per multiply-add), for the "
             "whole layer and for the attention alone (layer minus the projections U', U''); "
             "the hand count of the attention is checked against the counter in the tests "
             "(had: the counter also sees the |a|^2/2 column the fast path carries, 2 T H per "
             "head and modality). The paper does not say what its FLOPs count, so the "
             "**ratios between variants** are what should carry over.", ""]
    for entry in payload["results"]:
        primary = " (primary)" if entry["length"] == payload["primary_length"] else ""
        lines += [f"### T = {entry['length']}{primary}", "",
                  "| variant | ours, layer | ours, attention | attention by hand | paper (Table 4) "
                  "| ours / MAN, layer | ours / MAN, attention | paper / MAN | 689 test samples (s) "
                  "| time / MAN | paper time / MAN |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, values in entry["variants"].items():
            ratios = values["ratio_to_man"]
            seconds = values.get("test_set_seconds", {}).get("median")
            lines.append(
                f"| {name} | {values['flops']['total']:.3g} | {values['flops']['attention']:.3g} "
                f"| {values['flops']['attention_by_hand']:.3g} | {values['paper_flops']:.3g} "
                f"| {ratios['flops_total']:.2f} | {ratios['flops_attention']:.2f} "
                f"| {ratios['paper_flops']:.2f} | {'n/a' if seconds is None else f'{seconds:.3f}'} "
                f"| {ratios.get('seconds', float('nan')):.2f} | {ratios.get('paper_seconds', float('nan')):.2f} |")
        lines.append("")
    primary = next(e for e in payload["results"] if e["length"] == payload["primary_length"])
    ratios = {name: values["ratio_to_man"] for name, values in primary["variants"].items()}
    lines += [
        f"Reading (T = {primary['length']}): the paper puts w/o LSC at "
        f"{ratios['w/o LSC']['paper_flops']:.2f} of MAN, we count {ratios['w/o LSC']['flops_total']:.2f} "
        "(the LSC columns enlarge K' from 4 to 8 in the exponent of Eq. 11). The tensor "
        f"variants cost {ratios['w/o HAD']['paper_flops']:.1f}x (w/o HAD) and "
        f"{ratios['w/o CAO']['paper_flops']:.1f}x (w/o CAO) MAN in the paper, "
        f"{ratios['w/o HAD']['flops_total']:.1f}x and {ratios['w/o CAO']['flops_total']:.1f}x here "
        f"({ratios['w/o HAD']['flops_attention']:.1f}x and {ratios['w/o CAO']['flops_attention']:.1f}x "
        "for the attention alone). Their cost grows as T^3 against T for MAN, so the gap "
        "depends on the unstated length and on how the tuple tensor is contracted. Times: one "
        "pass of one layer over the 689 test samples in batches of 32 on this CPU; the "
        "paper's appendix Table 1 reports the whole model on an RTX 3080 Ti.",
        "", f"Load during the run: {_load(payload.get('load'))}. Machine: {_machine(payload)}.", ""]
    if (folder / "paper_flops.png").exists():
        lines += ["![FLOPs relative to MAN](benchmarks/paper_flops.png)", ""]
    return lines


def complexity_section(payload: dict[str, Any], folder: Path) -> list[str]:
    settings = payload["settings"]
    lines = ["## Cost against the number of modalities, the length, H and the batch size", "",
             f"`{COMMANDS['complexity']}`. One axis at a time; the others at m = "
             f"{settings['base_modalities']}, T = {settings['base_length']}, H = "
             f"{settings['base_random_features']}, batch {settings['base_batch']}; every modality "
             f"of feature size {settings['hidden_dim']}, MAN with {settings['heads']} heads and "
             f"{settings['chunks']} LSC chunks (hadamard mode: none). Forward: eval mode, "
             f"`torch.no_grad`; forward + backward: gradients of all parameters of the sum of the "
             f"output; medians of {settings['repeats']} calls after {settings['warmup']} warm-up "
             f"call(s). Exact and hadamard modes build a B x heads x T^m tensor and run only when "
             f"the predicted memory is under **{format_bytes(settings['exact_memory_bound'])}** "
             f"(forward + backward prediction); the other points say what they would need.", ""]
    label = {"modalities": "m", "length": "T", "random_features": "H", "batch": "batch"}
    for sweep in dict.fromkeys(row["sweep"] for row in payload["rows"]):
        rows = [row for row in payload["rows"] if row["sweep"] == sweep]
        key = sweep
        models = list(dict.fromkeys(row["model"] for row in rows))
        values = list(dict.fromkeys(row[key] for row in rows))
        lines += [f"### Against {label[sweep]}", "",
                  "Forward ms / forward + backward ms / MFLOP / peak memory:", "",
                  "| model | " + " | ".join(f"{label[sweep]} = {v}" for v in values) + " |",
                  "|---|" + "---:|" * len(values)]
        for model in models:
            cells = []
            for value in values:
                row = next((r for r in rows if r["model"] == model and r[key] == value), None)
                if row is None:
                    cells.append("")
                elif row["status"] == "ok":
                    backward = (row["forward_backward_s"] or {}).get("median")
                    mark = " †" if _disturbed(row) else ""
                    cells.append(f"{_ms(row['forward_s']['median'])} / {_ms(backward)} / "
                                 f"{row['flops'] / 1e6:.3g} / {format_bytes(row['peak_bytes'])}{mark}")
                elif row["status"] == "not run":
                    needed = row.get("predicted_bytes")
                    cells.append(f"not run (would need {format_bytes(needed)})" if needed
                                 else "not run")
                else:
                    cells.append("n/a")
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines.append("")
        if sweep in ("modalities", "length"):
            lines += _growth_table(rows, key, models, label[sweep])
        if (folder / f"complexity_{sweep}.png").exists():
            lines += [f"![complexity against {label[sweep]}](benchmarks/complexity_{sweep}.png)", ""]
    disturbed = sum(1 for row in payload["rows"] if row["status"] == "ok" and _disturbed(row))
    if disturbed:
        lines += [f"† {disturbed} point(s) timed while other processes took more than 10% of "
                  "the CPUs: their times are inflated.", ""]
    reasons = sorted({row["reason"] for row in payload["rows"]
                      if row["status"] == "not run" and not row.get("predicted_bytes")})
    if reasons:
        lines += ["Other points not run:", ""] + [f"- {reason}" for reason in reasons] + [""]
    lines += [f"Load during the run: {_load(payload.get('load'))}. Machine: {_machine(payload)}.", ""]
    return lines


def _disturbed(row: dict[str, Any]) -> bool:
    """Other processes took more than 10% of the CPUs while the point was timed (read
    from /proc/stat, whose 10 ms ticks make windows under 0.25 s too coarse to judge)."""
    load = row.get("load") or {}
    others = load.get("others")
    return others is not None and load.get("seconds", 0) >= 0.25 and others > 0.10


def _growth_table(rows: list[dict[str, Any]], key: str, models: list[str], name: str) -> list[str]:
    """Least-squares slope of log(cost) against log(m) or log(T) over the points run:
    about 1 for linear growth; the exact modes' tuple tensor grows as T^m."""
    lines = [f"Growth: slope of log(cost) against log({name}) over the points run "
             "(1 = linear):", "", "| model | points | FLOPs | forward time | peak memory |",
             "|---|---:|---:|---:|---:|"]
    for model in models:
        run = [row for row in rows if row["model"] == model and row["status"] == "ok"]
        if len(run) < 2:
            continue
        sizes = [row[key] for row in run]
        cells = []
        for value in (lambda r: r["flops"], lambda r: r["forward_s"]["median"],
                      lambda r: r["peak_bytes"]):
            values = [value(row) for row in run]
            cells.append(f"{geometric_growth(values, sizes):.2f}"
                         if all(v and v > 0 for v in values) else "n/a")
        lines.append(f"| {model} | {len(run)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def approximation_section(payload: dict[str, Any], folder: Path) -> list[str]:
    settings = payload["settings"]
    lines = ["## Approximation error of had mode", "",
             f"`{COMMANDS['approximation']}`. Float64. **Attention output**: features "
             f"a_j[t] ~ N(0, s^2 I_{settings['feature_dim']}), values N(0, I_{settings['value_dim']}), "
             "lengths (20, 30) for m = 2, (20, 30, 25) for m = 3, (12, 15, 10, 12) for m = 4, "
             "(6, 8, 5, 6, 8, 5) for m = 6; W a standard orthogonal Gaussian (H, 8) passed to "
             "`multilinear_attention(..., mode=\"had\", random_matrix=W)`; |had - exact| / |exact|, "
             f"median over {settings['seeds']} draws of data and W, for MAN's ARF "
             "(`estimator=\"arf\"`) and the default centred generalised features "
             "(`estimator=\"gerf\"`) on the same draws. The last two columns are the "
             "theoretical relative variance of one tuple's kernel estimate at the tuples' mean "
             "squared norm (appendix Eq. 12 for ARF, `gerf_relative_variance` for gerf).", "",
             payload["table"], "",
             f"**Kernel estimate (ARF)**: m = 3 vectors of norm |v|, {settings['kernel_draws']} draws "
             "of W per point, beside appendix Eq. 12.", "",
             "| abs v | H | predicted MSE (i.i.d.) | measured MSE, i.i.d. | measured / predicted "
             "| measured MSE, orthogonal | orthogonal / i.i.d. |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in payload["kernel"]:
        lines.append(
            f"| {row['norm']} | {row['random_features']} | {row['predicted_mse_iid']:.3g} "
            f"| {row['measured_mse_iid']:.3g} | {row['measured_mse_iid'] / row['predicted_mse_iid']:.2f} "
            f"| {row['measured_mse_orthogonal']:.3g} "
            f"| {row['measured_mse_orthogonal'] / row['measured_mse_iid']:.2f} |")
    lines.append("")
    for name, caption in (("approximation_kernel_mse.png", "kernel MSE against H"),
                          ("approximation_attention_error.png", "attention error against H")):
        if (folder / name).exists():
            lines += [f"![{caption}](benchmarks/{name})", ""]
    lines += [f"Machine: {_machine(payload)}.", ""]
    return lines



def backbones_section(payload: dict[str, Any], folder: Path) -> list[str]:
    """MulT + MAN against MulT (and LSTM + LMF with and without MAN): epoch time and latency."""
    settings = payload["settings"]
    lines = [
        "## The backbones of MAN appendix H.1: MulT + MAN against MulT",
        "",
        f"`{COMMANDS['backbones']}` (this run: --batches {settings['batches']} --repeats {settings['repeats']} "
        f"--threads {settings['threads']}). Models built from configs/mosi/backbones/ as `polyfuse compare` builds "
        f"them; random inputs of the contextual MOSI shape (window {settings['window']}, text 100 / audio 73 / "
        f"video 100 features). A training epoch is {settings['batches']} AdamW steps on batches of "
        f"{settings['batch_size']} (MOSI's training part is 39 such batches, the default); inference is one eval-mode forward pass on {settings['eval_batch']} samples. "
        f"Medians, the models timed in turns. 1-minute load average before / after: "
        f"{payload['load_average_1min'][0]:.1f} / {payload['load_average_1min'][1]:.1f} on "
        f"{payload['machine'].get('logical_cpus', '?')} logical CPUs.",
        "",
        *(["**The machine was loaded beyond its CPU count during this run: the timings are noise, "
            "rerun the command on a quiet machine before reading a ratio.**", ""]
          if payload["load_average_1min"][0] > (payload["machine"].get("logical_cpus") or 1) else []),
        f"| model | parameters | s / {settings['batches']} training steps | ms / inference batch |",
        "|---|---:|---:|---:|",
    ]
    for name, row in payload["models"].items():
        lines.append(f"| {name} | {row['parameters']:,} | {row['epoch_seconds']['median']:.2f} | "
                     f"{_ms(row['inference_seconds']['median'])} |")
    models = payload["models"]
    for alone, both in (("mult", "mult_man"), ("lstm_lmf", "lstm_lmf_man")):
        if alone in models and both in models:
            epoch = models[both]["epoch_seconds"]["median"] / models[alone]["epoch_seconds"]["median"]
            infer = models[both]["inference_seconds"]["median"] / models[alone]["inference_seconds"]["median"]
            lines.append(f"\n{both} / {alone}: {epoch:.2f}x training time, {infer:.2f}x inference latency.")
    return [*lines, ""]


def ops_section(payload: dict[str, Any], folder: Path) -> list[str]:
    """Operations dispatched per forward and forward+backward of every registered module."""
    return ops_markdown(payload)


def data_section(payload: dict[str, Any], folder: Path) -> list[str]:
    """Every task's loader (peak RSS, items/s at N and 4N, 0 and 2 workers) beside its training step."""
    return [*data_markdown(payload, COMMANDS["data"]).rstrip("\n").split("\n"), ""]


GPU_COMMANDS = """```bash
polyfuse bench gpu --output-dir docs/benchmarks
polyfuse bench peers --device cuda --man PATH/MAN --ban-vqa PATH/ban-vqa --multibench PATH/MultiBench \\
    --batch-sizes '32 512' --output-dir docs/benchmarks
polyfuse bench compile --device cuda --batch 256 --train --output-dir docs/benchmarks
```"""

# Issue 26's own measurements (an H100 / H200, main 71d5fea), quoted as the issue gives them.
ISSUE_GPU_FIGURES = [
    "every registered module's float32 output equals its CPU output within 7e-6 relative;",
    "MAN forward 5.0 ms at batch 32 and 5.4 ms at batch 256; MAN (had) forward+backward 9.3 to 11.3 ms, "
    "flat from T = 50 to T = 1,600 steps per modality (batch 32, 3 modalities of 40, 10 heads, H = 24): "
    "launch-bound; BAN forward 7.5 ms at batch 32 and at 256;",
    "MAN exact against had: exact T = 100: 19.6 ms, 5.3 GB; T = 200: 133 ms, 41.6 GB; T = 400: out of "
    "memory (76 GiB asked); had T = 1,600: 10.7 ms, 0.77 GB; at T = 50 exact (6.8 ms) is faster than had (9.6 ms);",
    "against the peers (polyfuse time / peer time, forward, forward+backward, batch 32 and 512): MAN layer "
    "vs wangzih98/MAN 1.28-1.32, 1.13-1.14; BAN at VQA size vs jnhwkim/ban-vqa 0.76-0.86, 0.79-0.91; BAN "
    "small 0.74, 0.79-0.80; TFN vs MultiBench 1.48-1.64, 1.26-1.27; LMF vs MultiBench 1.77-1.81, 1.16-1.18 "
    "(ban-vqa needed one `view` -> `reshape` to run on current CUDA);",
    "`torch.compile(fullgraph=True)`, training mode, forward+backward at batch 256: MAN 1.9x faster than "
    "eager (47 s to compile), BAN 1.9x, LMF 0.43x and TFN 0.45x (their LSTM traced into the graph);",
    "MAN under `torch.autocast` with bfloat16 or float16 raised a dtype error (fixed since: see the "
    "contract test's autocast bounds).",
]


def gpu_status_section(folder: Path) -> list[str]:
    """Where no GPU result is in ``folder`` (``gpu.json`` measured on CUDA, whose
    ``gpu.md`` is then a section of its own): how to record one, and the issue's figures."""
    path = folder / "gpu.json"
    if path.exists() and read_results(path)["settings"].get("device", "cpu").startswith("cuda"):
        return []
    return ["## On the GPU: not yet recorded from this repository", "",
            "No GPU was lent to the sessions that wrote this file: none of its tables is a GPU "
            "measurement. On a machine with CUDA, these record every module by batch and length (eager and "
            "compiled, fp32 and bf16, peak memory, MAN's exact/had crossover), the peers on the GPU "
            "(`peers_cuda.md`) and compiled against eager as the issue measured it, then "
            "`python scripts/write_benchmarks_md.py` adds them here:", "", GPU_COMMANDS, "",
            "`scripts/gpu_session.sh OUT PEERS` runs all of it as one prepared session of about 9 minutes "
            "(the CUDA tests and the sync-debug check first, each step under a time limit; "
            "`--cpu-dry-run` runs the same steps on the CPU at tiny sizes, `--stage-peers` copies the peer "
            "files a device machine needs).", "",
            "**Measured by the issue on main 71d5fea** (issue 26, an H100 / H200, one process per run, CUDA "
            "events; quoted, not reproduced from this repository, and several of these modules changed since):",
            "", *[f"- {figure}" for figure in ISSUE_GPU_FIGURES], ""]


SECTIONS = {"targets": targets_section, "paper": paper_section,
            "complexity": complexity_section, "approximation": approximation_section,
            "backbones": backbones_section, "ops": ops_section, "data": data_section}


def render(folder: Path) -> str:
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by scripts/write_benchmarks_md.py from docs/benchmarks/*.json: "
        "do not edit by hand. -->",
        "",
        "Figures of real runs of `polyfuse bench` on this project's 2-core CPU machine, "
        "written by `python scripts/write_benchmarks_md.py` from the JSON results in "
        "`docs/benchmarks/` (the plots are there too). Timings vary with the machine's load, "
        "which every section records; the speed targets are ratios measured in one run for "
        "that reason. No GPU timings: no accelerator was available for these runs. The "
        "commands assume the README's [set-up](../README.md#set-up) (`.venv` activated).",
        "",
        "What the numbers mean: **time** is wall-clock (`time.perf_counter`), the median of "
        "repeated calls after warm-up; **FLOPs** are what `torch.utils.flop_counter."
        "FlopCounterMode` counts, i.e. matrix products (2 FLOPs per multiply-add), not "
        "element-wise work (exp, softmax, Hadamard products) and not fused "
        "`scaled_dot_product_attention` on CPU; **peak memory** is the high-water mark of "
        "bytes allocated through PyTorch's CPU allocator during one forward pass above the "
        "level at its start (from `torch.profiler` allocation events): it excludes the inputs "
        "and parameters, memory that MKL/oneDNN allocate themselves and what the C allocator "
        "keeps after a free, so the process's resident size is larger (`tracemalloc` would "
        "see none of the tensor memory).",
        "",
    ]
    for name in ORDER:
        path = folder / f"{name}.json"
        if not path.exists():
            lines += [f"## {name}", "", f"No result yet: run `{COMMANDS[name]}`.", ""]
            continue
        lines += SECTIONS[name](read_results(path), folder) if name != "targets" else \
            SECTIONS[name](read_results(path))
    lines += gpu_status_section(folder)
    for extra in sorted(folder.glob("*.md")):  # sections measured by other commands (vqa.md)
        lines += [extra.read_text(encoding="utf-8").rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--output", type=Path, default=Path("docs/BENCHMARKS.md"))
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(args.results), encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
