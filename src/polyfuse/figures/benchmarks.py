"""The figures of ``polyfuse bench``: each draws one benchmark's payload (the dict its
JSON result holds) into PNG files of a folder and returns their paths."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polyfuse.figures.common import pyplot

__all__ = ["draw_approximation", "draw_captioning_bench", "draw_complexity", "draw_paper"]

_SWEEP_LABELS = {
    "modalities": "number of modalities m",
    "length": "length T of every modality",
    "random_features": "random features H",
    "batch": "batch size",
}
_MODEL_STYLE = {
    "man-exact": ("C3", "o", "MAN exact (w/o HAD)"),
    "man-hadamard": ("C1", "s", "MAN hadamard (w/o CAO)"),
    "man-had": ("C0", "^", "MAN had"),
    "ban": ("C2", "D", "BAN"),
    "tfn": ("C4", "v", "TFN"),
    "lmf": ("C5", "P", "LMF"),
}


def draw_complexity(payload: dict[str, Any], folder: str | Path) -> list[Path]:
    """One figure per sweep: FLOPs, forward time, forward + backward time, peak memory."""
    plt = pyplot()
    from matplotlib.transforms import blended_transform_factory

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    rows = payload["rows"]
    for sweep in dict.fromkeys(row["sweep"] for row in rows):
        sweep_rows = [row for row in rows if row["sweep"] == sweep]
        key = {"modalities": "modalities", "length": "length",
               "random_features": "random_features", "batch": "batch"}[sweep]
        panels = [("flops", "FLOPs (matrix products)", lambda r: r["flops"]),
                  ("forward", "forward time (s)", lambda r: r["forward_s"]["median"]),
                  ("forward_backward", "forward + backward time (s)",
                   lambda r: (r["forward_backward_s"] or {}).get("median")),
                  ("memory", "peak allocated memory (bytes)", lambda r: r["peak_bytes"])]
        figure, axes = plt.subplots(1, 4, figsize=(17, 4))
        for axis, (_, title, value) in zip(axes, panels, strict=True):
            for model in dict.fromkeys(row["model"] for row in sweep_rows):
                color, marker, label = _MODEL_STYLE.get(model, ("k", ".", model))
                points = [(row[key], value(row)) for row in sweep_rows
                          if row["model"] == model and row["status"] == "ok" and value(row)]
                skipped = [row[key] for row in sweep_rows
                           if row["model"] == model and row["status"] == "not run"]
                if points:
                    xs, ys = zip(*points, strict=True)
                    axis.plot(xs, ys, color=color, marker=marker, label=label)
                if skipped:  # at the top edge: off the chart, not a value
                    edge = blended_transform_factory(axis.transData, axis.transAxes)
                    axis.scatter(skipped, [0.97] * len(skipped), color=color, marker="x",
                                 transform=edge, clip_on=False)
            axis.set_xscale("log" if sweep != "modalities" else "linear")
            axis.set_yscale("log")
            axis.set_xlabel(_SWEEP_LABELS[sweep])
            axis.set_title(title, fontsize=10)
            axis.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        figure.suptitle(f"complexity against the {_SWEEP_LABELS[sweep]} (x at the top: not run, "
                        "over the memory bound or refused by the module)", fontsize=10)
        figure.tight_layout()
        path = folder / f"complexity_{sweep}.png"
        figure.savefig(path, dpi=80)
        plt.close(figure)
        paths.append(path)
    return paths


def draw_paper(payload: dict[str, Any], folder: str | Path) -> list[Path]:
    """FLOPs of the four variants relative to MAN: ours (total, attention) and the paper's."""
    plt = pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entry = next(e for e in payload["results"] if e["length"] == payload["primary_length"])
    names = list(entry["variants"])
    series = [("ours, whole layer", "flops_total", "C0"),
              ("ours, attention only", "flops_attention", "C9"),
              ("paper, Table 4", "paper_flops", "C3")]
    figure, axis = plt.subplots(figsize=(7, 4))
    width = 0.25
    for i, (label, key, color) in enumerate(series):
        values = [entry["variants"][name]["ratio_to_man"][key] for name in names]
        axis.bar([x + (i - 1) * width for x in range(len(names))], values, width, label=label, color=color)
    axis.set_xticks(range(len(names)), names)
    axis.set_yscale("log")
    axis.set_ylabel("FLOPs relative to MAN")
    axis.set_title(f"CMU-MOSI configuration, T = {entry['length']} (one integration layer)", fontsize=10)
    axis.legend(fontsize=8)
    axis.grid(True, axis="y", which="both", alpha=0.3)
    figure.tight_layout()
    path = folder / "paper_flops.png"
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return [path]


def draw_approximation(payload: dict[str, Any], folder: str | Path) -> list[Path]:
    """Output error of had (ARF and gerf) against H, one panel per m; ARF kernel MSE
    against H with appendix Eq. 12's prediction."""
    plt = pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    rows = payload["attention"]
    modalities: Sequence[int] = list(dict.fromkeys(row["modalities"] for row in rows))
    figure, axes = plt.subplots(1, len(modalities), figsize=(4.2 * len(modalities), 4), squeeze=False)
    for axis, m in zip(axes[0], modalities, strict=True):
        for index, scale in enumerate(dict.fromkeys(row["scale"] for row in rows)):
            points = [row for row in rows if row["modalities"] == m and row["scale"] == scale]
            hs = [row["random_features"] for row in points]
            for estimator, style in (("arf", "--x"), ("gerf", "-o")):
                axis.plot(hs, [row[f"error_{estimator}"] for row in points], style, color=f"C{index}",
                          label=f"s = {scale}, {estimator}")
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("random features H")
        axis.set_title(f"m = {m}", fontsize=10)
        axis.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("|had - exact| / |exact| (median)")
    axes[0][-1].legend(fontsize=7)
    figure.tight_layout()
    path = folder / "approximation_attention_error.png"
    figure.savefig(path, dpi=80)
    plt.close(figure)
    paths.append(path)
    if payload.get("choices"):
        paths.append(_draw_choices(plt, payload["choices"], folder))

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, norm in enumerate(dict.fromkeys(row["norm"] for row in payload["kernel"])):
        points = [row for row in payload["kernel"] if row["norm"] == norm]
        hs = [row["random_features"] for row in points]
        color = f"C{index}"
        axis.plot(hs, [row["predicted_mse_iid"] for row in points], color=color, linestyle="-",
                  label=f"|v| = {norm}: Eq. 12 prediction (i.i.d.)")
        axis.plot(hs, [row["measured_mse_iid"] for row in points], color=color, marker="o",
                  linestyle="none", label=f"|v| = {norm}: measured, i.i.d.")
        axis.plot(hs, [row["measured_mse_orthogonal"] for row in points], color=color, marker="x",
                  linestyle="none", label=f"|v| = {norm}: measured, orthogonal")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("random features H")
    axis.set_ylabel("mean squared error of the kernel estimate")
    axis.set_title("ARF estimate of exp(sum_{j<k} v_j . v_k), m = 3 (appendix Eq. 12)", fontsize=10)
    axis.legend(fontsize=7)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path = folder / "approximation_kernel_mse.png"
    figure.savefig(path, dpi=80)
    plt.close(figure)
    paths.append(path)
    return paths


def _draw_choices(plt: Any, rows: list[dict[str, Any]], folder: Path) -> Path:
    """Output error against forward+backward time, one line per way of computing the
    attention (its points the H grid), exact as the reference point at error 0."""
    figure, axis = plt.subplots(figsize=(6, 4))
    for index, label in enumerate(dict.fromkeys(row["choice"] for row in rows)):
        points = [row for row in rows if row["choice"] == label]
        times = [row["forward_backward_ms"] for row in points]
        errors = [max(row["output_error"], 1e-3) for row in points]
        axis.plot(times, errors, "-o", color=f"C{index}", label=label)
        for row, time, error in zip(points, times, errors, strict=True):
            if row["random_features"]:
                axis.annotate(f"H={row['random_features']}", (time, error), fontsize=7)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("forward+backward time (ms)")
    axis.set_ylabel("output error |had - exact| / |exact| (exact at 1e-3)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    path = folder / "approximation_choices.png"
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def draw_captioning_bench(payload: dict[str, Any], folder: str | Path) -> list[Path]:
    """Time and peak memory against n, one line per (orders, exact / low rank)."""
    plt = pyplot()
    folder = Path(folder)
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for orders in dict.fromkeys(r["orders"] for r in payload["rows"]):
        rows = [r for r in payload["rows"] if r["orders"] == orders]
        n = [r["modalities"] for r in rows]
        for kind, label, style in (("exact", "HOCA", "-o"), ("low_rank", "L-HOCA", "--s")):
            axes[0].plot(n, [1e3 * r[f"{kind}_seconds"] for r in rows], style, label=f"{label}-{orders}")
            memory = [r[f"{kind}_peak_bytes"] for r in rows]
            if all(m is not None for m in memory):
                axes[1].plot(n, [m / 2**20 for m in memory], style, label=f"{label}-{orders}")
    settings = payload["settings"]
    for axis, title in ((axes[0], "decoder step time (ms, median)"), (axes[1], "peak allocated memory (MiB)")):
        axis.set_yscale("log")
        axis.set_xlabel("modalities n")
        axis.set_title(title)
        axis.set_xticks(list(settings["modalities"]))
        axis.legend(fontsize=8)
    figure.suptitle(f"one caption-decoder step: T = {settings['length']}, batch {settings['batch']}, "
                    f"hidden {settings['hidden_dim']}, attention {settings['attention_dim']}", fontsize=9)
    figure.tight_layout()
    path = folder / "captioning_decoder_step.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path]
