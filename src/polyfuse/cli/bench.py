"""``polyfuse bench``: cost, paper figures, approximation error, speed targets and peers.

Each sub-command writes ``<output-dir>/<name>.json`` and, unless ``--no-plots``,
PNG plots beside it; ``scripts/write_benchmarks_md.py`` turns a folder of results
into ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polyfuse.bench.peers import Change

__all__ = ["add_parser", "run"]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(value) for value in text.replace(",", " ").split())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(value) for value in text.replace(",", " ").split())


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.replace(",", " ").split())


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmarks: complexity, the MAN paper's figures, approximation error, speed targets, peers",
        description=__doc__.split("\n\n")[0].removeprefix("``polyfuse bench``: "),
    )
    commands = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--output-dir", type=Path, default=Path("benchmark-results"),
                         help="folder for the JSON result and the plots (default benchmark-results)")
        sub.add_argument("--no-plots", action="store_true", help="write the JSON only")
        sub.add_argument("--threads", type=int, default=None,
                         help="torch intra-op threads (default: torch's choice)")
        sub.add_argument("--quiet", action="store_true", help="no progress lines")
        sub.set_defaults(run=run)

    complexity = commands.add_parser(
        "complexity",
        help="FLOPs, time and peak memory against m, T, H and batch size",
        description=(
            "FLOPs (FlopCounterMode), forward and forward+backward wall time (median "
            "after warm-up) and peak allocated memory of MAN exact / hadamard / had, BAN, "
            "TFN and LMF, over the number of modalities, the length, the random features "
            "and the batch size (one axis at a time, the others at their base value). "
            "MAN's exact and hadamard modes are run only when their predicted memory is "
            "under --exact-memory-bound; the other points are recorded as not run."
        ),
    )
    complexity.add_argument("--preset", choices=("full", "quick"), default="full",
                            help="grids to start from (quick: tiny, seconds)")
    complexity.add_argument("--sweeps", type=_words, default=None,
                            help="axes to sweep, of: modalities length random_features batch")
    complexity.add_argument("--modalities", type=_ints, default=None, help="grid of m, e.g. '2 3 4'")
    complexity.add_argument("--lengths", type=_ints, default=None, help="grid of T, e.g. '10 50 400'")
    complexity.add_argument("--random-features", type=_ints, default=None, help="grid of H")
    complexity.add_argument("--batch-sizes", type=_ints, default=None, help="grid of batch sizes")
    complexity.add_argument("--models", type=_words, default=None,
                            help="of: man-exact man-hadamard man-had ban tfn lmf")
    complexity.add_argument("--base", type=_ints, default=None, metavar="'M T H B'",
                            help="values of the axes that are not swept")
    complexity.add_argument("--hidden-dim", type=int, default=None)
    complexity.add_argument("--heads", type=int, default=None)
    complexity.add_argument("--repeats", type=int, default=None)
    complexity.add_argument("--warmup", type=int, default=None)
    complexity.add_argument("--exact-memory-bound", default=None,
                            help="e.g. 2GiB (full preset), 64MiB (quick)")
    complexity.add_argument("--no-backward", action="store_true", help="skip forward+backward")
    complexity.add_argument("--no-memory", action="store_true", help="skip peak memory")
    common(complexity)

    paper = commands.add_parser(
        "paper",
        help="the MAN paper's CMU-MOSI configuration beside its Table 4",
        description=(
            "FLOPs of one integration layer (hidden size 40, 10 heads, 24 random "
            "features, 4 chunks, 3 modalities) for MAN, w/o HAD, w/o CAO and w/o LSC, "
            "beside the paper's Table 4, with the ratios between variants, and the time "
            "of one pass over the 689 test samples in batches of 32. The first length is "
            "the primary one (50: MulT's word-aligned CMU-MOSI)."
        ),
    )
    paper.add_argument("--lengths", type=_ints, default=(50, 20), help="default '50 20'")
    paper.add_argument("--repeats", type=int, default=5)
    paper.add_argument("--warmup", type=int, default=1)
    paper.add_argument("--no-timing", action="store_true", help="FLOPs only")
    common(paper)

    approximation = commands.add_parser(
        "approximation",
        help="had against exact: output error of ARF and gerf, theoretical variance, Eq. 12",
        description=(
            "Relative error of had against exact attention output for MAN's ARF and the "
            "default gerf estimator side by side (m, H and feature scale s grids, median "
            "over seeds) with the theoretical kernel variance of each; the ARF kernel MSE "
            "beside appendix Eq. 12. With --checkpoint: a trained MAN's metrics and fusion "
            "output error with had (gerf, ARF) against exact."
        ),
    )
    approximation.add_argument("--preset", choices=("full", "quick"), default="full")
    approximation.add_argument("--modalities", type=_ints, default=None, help="grid of m")
    approximation.add_argument("--random-features", type=_ints, default=None, help="grid of H")
    approximation.add_argument("--scales", type=_floats, default=None, help="feature std s grid")
    approximation.add_argument("--seeds", type=int, default=None, help="draws of data and W per point")
    approximation.add_argument("--kernel-draws", type=int, default=None)
    approximation.add_argument("--choice-random-features", type=_ints, default=None,
                               help="H grid of the choices table (error against cost)")
    approximation.add_argument("--task-epochs", type=int, default=None,
                               help="demo training epochs per choice row (0: no task column)")
    approximation.add_argument("--task-seeds", type=int, default=None)
    approximation.add_argument("--seed", type=int, default=None)
    approximation.add_argument("--checkpoint", default=None,
                               help="a trained MAN .safetensors checkpoint: had vs exact on --split")
    approximation.add_argument("--split", default="test")
    approximation.add_argument("--data", default=None, help="data source for --checkpoint")
    common(approximation)

    targets = commands.add_parser(
        "targets",
        help="the speed targets (docs/BENCHMARKS.md), each a ratio measured in one run",
        description=(
            "exact/had forward time (MOSI configuration, m=3, T=50, batch 32) >= 50; had "
            "time m=8 / m=2 <= 4.5; T=400 / T=50 <= 10; had attention FLOP rate at m=7, "
            "T=30, hidden 512, 8 heads, H=512, batch 32 >= 40% of a 2048^3 float32 "
            "matrix product's. Run it on a quiet machine: the load is recorded."
        ),
    )
    targets.add_argument("--repeats", type=int, default=15)
    targets.add_argument("--warmup", type=int, default=2)
    targets.add_argument("--quick", action="store_true",
                         help="tiny sizes that exercise the code (not the issue's targets)")
    common(targets)

    compiled = commands.add_parser(
        "compile",
        help="eager vs polyfuse.nn.compile (torch.compile) time of every registered fusion module",
        description=(
            "Forward and forward+backward of each registered module (batch 32, lengths "
            "20/30/25, sizes 64/48/32), eager and compiled with inductor as polyfuse.nn.compile "
            "recommends (fullgraph=True but for TFN and LMF, whose LSTMs run eagerly), timed in "
            "turns (CUDA events on CUDA); prints the speed-ups (eager / compiled) with quartiles "
            "and the compile time. Compiling takes tens of seconds per module on 2 cores."
        ),
    )
    compiled.add_argument("--modules", type=_words, default=None,
                          help="default: every registered one (lmf, tfn, man, ban first)")
    compiled.add_argument("--batch", type=int, default=32)
    compiled.add_argument("--repeats", type=int, default=15)
    compiled.add_argument("--warmup", type=int, default=2)
    compiled.add_argument("--mode", choices=("default", "reduce-overhead", "max-autotune"), default="default",
                          help="torch.compile mode (reduce-overhead: CUDA graphs on CUDA; on the CPU "
                               "torch skips them and compiles as the default mode)")
    compiled.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    compiled.add_argument("--train", action="store_true",
                          help="modules in train mode (dropout on: outputs are not compared)")
    compiled.add_argument("--backend", default="inductor",
                          help="torch.compile backend (default inductor; eager or aot_eager trace without "
                               "generating code: a dry run)")
    compiled.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                          help="start no new module after this many seconds (the rest are listed as not run)")
    common(compiled)

    maf = commands.add_parser(
        "maf",
        help="MAF's Eq. 19 attention entropy of trained captioning runs (literal vs log form)",
        description=(
            "For each captioning run (a run directory, or a polyfuse compare output: every "
            "<model>/seed<N> run below it), loads the best checkpoint, decodes the videos of "
            "--split greedily and reports each modality's mean Eq. 19 attention entropy, beside "
            "the test metrics of the run's results.json. Train the runs first, e.g. polyfuse "
            "compare --models configs/msvd/variants/maf_literal.yaml,configs/msvd/variants/maf_log.yaml. "
            "Writes maf.json and maf.md."
        ),
    )
    maf.add_argument("runs", nargs="+", type=Path, metavar="RUN",
                     help="a run directory (with results.json) or a polyfuse compare output directory")
    maf.add_argument("--split", default="test", help="the split decoded (default test)")
    common(maf)

    peers = commands.add_parser(
        "peers",
        help="polyfuse / peer time, side by side, same weights, outputs checked",
        description=(
            "MAN vs wangzih98/MAN, BAN vs jnhwkim/ban-vqa (VQA and small size), TFN, "
            "tensor_fusion, LMF and low_rank_fusion vs pliang279/MultiBench. The peers' "
            "modules are imported unchanged from the checkouts given; each side gets the "
            "same weights; a row whose outputs differ beyond --tolerance is not timed. "
            "Forward and forward+backward are timed in interleaved rounds at each thread "
            "count, in eval and in train mode; the ratio polyfuse / peer (below 1: polyfuse "
            "faster) is the median over rounds with its quartiles. A row whose checkout is "
            "missing is skipped. With --against, the result is held against a baseline: exit "
            "status 1 when a ratio is more than 15% worse or crosses 1.0."
        ),
    )
    peers.add_argument("--man", type=Path, default=None, help="checkout of github.com/wangzih98/MAN")
    peers.add_argument("--ban-vqa", type=Path, default=None, help="checkout of github.com/jnhwkim/ban-vqa")
    peers.add_argument("--multibench", type=Path, default=None,
                       help="checkout of github.com/pliang279/MultiBench")
    peers.add_argument("--rows", type=_words, default=None,
                       help="of: man man_published ban_vqa ban_small tfn tensor_fusion lmf low_rank_fusion")
    peers.add_argument("--device", default="cpu",
                       help="cpu (default) or cuda: on CUDA each call is timed by CUDA events, both sides "
                            "built on the CPU and moved; the result is written as peers_cuda.json / .md")
    peers.add_argument("--batch-sizes", type=_ints, default=None,
                       help="run every row at each of these batch sizes, e.g. '32 512' (default: each row's own, 32)")
    peers.add_argument("--thread-counts", type=_ints, default=None,
                       help="intra-op threads, each in turn (default '1 2' on the CPU, torch's count on CUDA)")
    peers.add_argument("--modes", type=_words, default=None,
                       help="the modules' modes to time, each in turn, of: eval train (default 'eval train')")
    peers.add_argument("--memory", type=_words, default=None, metavar="ROWS",
                       help="rows whose peak memory of one forward+backward per side is measured "
                            "(default 'ban_vqa ban_small'; 'none': no row)")
    peers.add_argument("--against", type=Path, default=None, metavar="BASELINE.json",
                       help="hold the result against an earlier one (the same rows, batch sizes, threads, modes "
                            "and memory rows unless given): one line per ratio, exit status 1 when one is more "
                            "than 15%% worse or crosses 1.0")
    peers.add_argument("--result", type=Path, default=None, metavar="NEW.json",
                       help="with --against: compare this result file with the baseline, measuring nothing")
    peers.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    peers.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    peers.add_argument("--tolerance", type=float, default=1e-5,
                       help="largest |difference| / max(1, max |peer output|) (default 1e-5)")
    peers.add_argument("--time-unequal", action="store_true",
                       help="time rows whose outputs differ too (flagged as such)")
    peers.add_argument("--profile", type=int, default=0, metavar="N",
                       help="record the top N operators of each side (torch.profiler, at the lowest thread count)")
    common(peers)
    _add_captioning(commands, common)
    _add_gpu(commands, common)
    _add_ops(commands, common)
    _add_ddp(commands, common)
    _add_data(commands, common)


def _add_gpu(commands: Any, common: Any) -> None:
    gpu = commands.add_parser(
        "gpu",
        help="every module by batch and length: eager and compiled, fp32 and bf16, memory; MAN's exact/had crossover",
        description=(
            "Every registered fusion module at each batch size and length, eager and compiled "
            "(polyfuse.nn.compile), fp32 and bf16 autocast, forward and forward+backward, timed in "
            "interleaved rounds by CUDA events, with peak memory (torch.cuda.max_memory_allocated); "
            "then MAN's exact and had modes over the lengths and the length where had gets faster. "
            "A failing cell records its error. Writes gpu.json and gpu.md (gpu_cpu.* with --device cpu)."
        ),
    )
    gpu.add_argument("--device", default=None, help="cuda (default) or cpu")
    gpu.add_argument("--quick", action="store_true",
                     help="tiny sizes on the CPU that exercise every path in seconds (not a measurement)")
    gpu.add_argument("--modules", type=_words, default=None, help="default: every registered one")
    gpu.add_argument("--batch-sizes", type=_ints, default=None, help="default '32 256'")
    gpu.add_argument("--lengths", type=_ints, default=None, help="steps per modality, default '50 200'")
    gpu.add_argument("--precisions", type=_words, default=None, help="of fp32 bf16 fp16 (default 'fp32 bf16')")
    gpu.add_argument("--no-compile", action="store_true", help="eager only")
    gpu.add_argument("--compiled-grid", choices=("all", "first"), default=None,
                     help="compile at every point (all, default) or at the first batch and length only")
    gpu.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"), default=None)
    gpu.add_argument("--backend", default=None, help="torch.compile backend (default inductor)")
    gpu.add_argument("--repeats", type=int, default=None)
    gpu.add_argument("--warmup", type=int, default=None)
    gpu.add_argument("--no-memory", action="store_true", help="skip peak memory")
    gpu.add_argument("--crossover-lengths", type=_ints, default=None,
                     help="MAN exact/had lengths, default '25 50 100 200 400 800 1600'; '' to skip")
    gpu.add_argument("--exact-memory-bound", default=None,
                     help="largest predicted memory of MAN's exact mode, e.g. 60GiB (default 80%% of the GPU)")
    gpu.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                     help="start no new grid row after this many seconds (the rest are listed as not run)")
    common(gpu)


def _gpu(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import gpu
    from polyfuse.bench.results import parse_bytes

    settings = gpu.QUICK if args.quick else gpu.FULL
    changes: dict[str, Any] = {name: getattr(args, name) for name in
                               ("device", "modules", "batch_sizes", "lengths", "precisions", "compiled_grid",
                                "backend", "repeats", "warmup", "crossover_lengths")
                               if getattr(args, name) is not None}
    if args.compile_mode is not None:
        changes["compile_mode"] = None if args.compile_mode == "default" else args.compile_mode
    if args.no_compile:
        changes["compiled"] = False
    if args.no_memory:
        changes["memory"] = False
    if args.exact_memory_bound is not None:
        changes["exact_memory_bound"] = parse_bytes(args.exact_memory_bound)
    if args.time_budget is not None:
        changes["time_budget_s"] = args.time_budget
    settings = dataclasses.replace(settings, **changes)
    payload = gpu.run_gpu_bench(settings, progress=_progress(args))
    on_gpu = payload["settings"]["device"].startswith("cuda")
    args.result_name = "gpu" if on_gpu else "gpu_cpu"
    command = "polyfuse bench " + " ".join(_given_arguments(args))
    report = gpu.gpu_markdown(payload, command)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{args.result_name}.md").write_text(report, encoding="utf-8")
    print(report)
    return payload, None


def _given_arguments(args: argparse.Namespace) -> list[str]:
    """The command line as given (sys.argv after ``bench``), for the report."""
    words = sys.argv[sys.argv.index("bench") + 1:] if "bench" in sys.argv else [args.benchmark]
    return [f"'{word}'" if " " in word or not word else word for word in words]


def _add_ops(commands: Any, common: Any) -> None:
    ops = commands.add_parser(
        "ops",
        help="ATen operations dispatched per forward and forward+backward of every registered module",
        description=(
            "Counts the operations (kernel launches on a GPU) of one forward (eval, "
            "torch.no_grad) and one forward+backward (eval, output.sum().backward()) of each "
            "registered fusion module with a TorchDispatchMode, at the sizes of docs/BENCHMARKS.md ('Operations dispatched') by "
            "default (out_dim 8, batch 8, sizes 300/74/35, lengths 20/30/25, random "
            "padding); prints the counts and the most frequent operations. Deterministic, "
            "seconds."
        ),
    )
    ops.add_argument("--modules", type=_words, default=None, help="default: every registered one")
    ops.add_argument("--batch", type=int, default=8)
    ops.add_argument("--dims", type=_ints, default=(300, 74, 35), help="feature sizes (default '300 74 35')")
    ops.add_argument("--lengths", type=_ints, default=(20, 30, 25), help="lengths (default '20 30 25')")
    ops.add_argument("--out-dim", type=int, default=8)
    ops.add_argument("--seed", type=int, default=0)
    ops.add_argument("--top", type=int, default=8, help="most frequent operations kept per module (default 8)")
    ops.add_argument("--baseline", type=Path, default=None,
                     help="an earlier ops.json (same sizes): its counts are shown beside the new ones")
    common(ops)


def _add_captioning(commands: Any, common: Any) -> None:
    captioning = commands.add_parser(
        "captioning",
        help="one caption-decoder step: HOCA vs Low-Rank HOCA for 3 to 6 modalities",
        description=(
            "Median time and peak allocated memory of one step of the MAF caption decoder "
            "with exact and low-rank HOCA (orders UBT and T) over the number of modalities; "
            "also writes captioning.md (the section of docs/BENCHMARKS.md) beside the JSON."
        ),
    )
    captioning.add_argument("--preset", choices=("full", "quick"), default="full",
                            help="quick: a seconds-long smoke run, not a measurement")
    captioning.add_argument("--modalities", type=_ints, default=None, help="grid of n, e.g. '3 4 5 6'")
    captioning.add_argument("--orders", type=_words, default=None, help="e.g. 'UBT T'")
    captioning.add_argument("--length", type=int, default=None, help="steps T per modality")
    captioning.add_argument("--batch", type=int, default=None)
    captioning.add_argument("--repeats", type=int, default=None)
    common(captioning)


def _captioning(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import captioning
    from polyfuse.figures.benchmarks import draw_captioning_bench

    settings = captioning.QUICK if args.preset == "quick" else captioning.FULL
    changes = {name: getattr(args, name) for name in ("modalities", "orders", "length", "batch", "repeats")
               if getattr(args, name) is not None}
    payload = captioning.run_captioning_bench(dataclasses.replace(settings, **changes), progress=_progress(args))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "captioning.md").write_text(captioning.captioning_markdown(payload))
    return payload, draw_captioning_bench


def _add_ddp(commands: Any, common: Any) -> None:
    ddp = commands.add_parser(
        "ddp",
        help="seconds per epoch of every task type with 1 and 2 processes (DDP, gloo on CPU)",
        description=(
            "Trains every task type on synthetic data (an epoch of about a second on one core) "
            "once with 1 process and once with 2 (DDP, gloo, one thread each, the same global "
            "batch), each run in fresh processes, and reports the median seconds per epoch after "
            "the warm-up epochs and their ratio (2 processes over 1; not a target on a 2-core "
            "machine). Also writes "
            "ddp.md (the section of docs/BENCHMARKS.md) beside the JSON."
        ),
    )
    ddp.add_argument("--quick", action="store_true",
                     help="sentiment only, a tenth of the data, 2 epochs: seconds, not a measurement")
    ddp.add_argument("--tasks", type=_words, default=None, help="task types (default: every registered one)")
    ddp.add_argument("--epochs", type=int, default=None, help="epochs per run (default 4)")
    ddp.add_argument("--warmup-epochs", type=int, default=None, help="first epochs left out (default 1)")
    ddp.add_argument("--scale", type=float, default=None, help="multiplies every task's number of samples (default 1)")
    ddp.add_argument("--repeats", type=int, default=None, help="runs of each, 1 and 2 processes in turns (default 1)")
    ddp.add_argument("--keep", type=Path, default=None, metavar="DIR",
                     help="write the data and the runs here (default: a temporary folder, removed)")
    common(ddp)


def _ddp(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import ddp

    if args.threads is not None:
        raise ValueError("bench ddp: every training process runs one thread (trainer.num_threads=1); drop --threads")
    settings = ddp.QUICK if args.quick else ddp.FULL
    changes = {name: getattr(args, name) for name in ("tasks", "epochs", "warmup_epochs", "scale", "repeats")
               if getattr(args, name) is not None}
    payload = ddp.run_ddp_bench(dataclasses.replace(settings, **changes), folder=args.keep, progress=_progress(args))
    report = ddp.ddp_markdown(payload, "polyfuse bench " + " ".join(_given_arguments(args)))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "ddp.md").write_text(report, encoding="utf-8")
    print(report)
    return payload, None


def _add_data(commands: Any, common: Any) -> None:
    data = commands.add_parser(
        "data",
        help="every task's training loader: peak RSS and items/s at N and 4N items, 0 and 2 workers, beside the training step",
        description=(
            "Writes every task's synthetic data (the bench ddp sets and vqa-bottom-up: 2048-d bottom-up "
            "features, 10 to 100 boxes) at N and 4N items, reads its training loader once with 0 and 2 "
            "loader workers, each in a new process (peak RSS, items per second after the first batch, the "
            "first batch's latency), and times the training step of the configuration's model (vqa-bottom-up: "
            "BAN at the default sizes); ratio: loader items/s with 2 workers at 4N over the step's. Prints the "
            "section of docs/BENCHMARKS.md (scripts/write_benchmarks_md.py writes it from data.json)."
        ),
    )
    data.add_argument("--quick", action="store_true",
                      help="sentiment only, a tenth of the data: seconds, not a measurement")
    data.add_argument("--tasks", type=_words, default=None,
                      help="of: sentiment traits classification vqa captioning retrieval chimera vqa-bottom-up "
                           "(default: all)")
    data.add_argument("--scale", type=float, default=None, help="multiplies every task's N (default 1)")
    data.add_argument("--max-batches", type=int, default=None, help="batches read per loader pass at most (default 2000)")
    data.add_argument("--fresh-interpreter", action="store_true",
                      help="each measurement a new interpreter (python -m polyfuse.bench.data --worker) instead of a "
                           "process forked from one that has imported the libraries (slower: the imports each time)")
    data.add_argument("--keep", type=Path, default=None, metavar="DIR",
                      help="write the data sets here (default: a temporary folder, removed)")
    common(data)


def _data(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import data

    settings = data.QUICK if args.quick else data.FULL
    changes = {name: getattr(args, name) for name in ("tasks", "scale", "max_batches") if getattr(args, name) is not None}
    if args.threads is not None:  # the training step's threads (the loaders' main processes keep torch's default)
        changes["step_threads"] = args.threads
    if args.fresh_interpreter:
        changes["fresh_interpreter"] = True
    payload = data.run_data_bench(dataclasses.replace(settings, **changes), folder=args.keep, progress=_progress(args))
    print(data.data_markdown(payload, "polyfuse bench " + " ".join(_given_arguments(args))))
    return payload, None


def _progress(args: argparse.Namespace) -> Any:
    return None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))


def _complexity(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import complexity
    from polyfuse.bench.results import parse_bytes
    from polyfuse.figures.benchmarks import draw_complexity

    settings = complexity.QUICK if args.preset == "quick" else complexity.FULL
    changes: dict[str, Any] = {}
    for name in ("modalities", "lengths", "random_features", "batch_sizes", "models",
                 "hidden_dim", "heads", "repeats", "warmup"):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    if args.base is not None:
        if len(args.base) != 4:
            raise ValueError("--base takes four values: m T H batch")
        changes |= dict(zip(("base_modalities", "base_length", "base_random_features",
                             "base_batch"), args.base, strict=True))
    if args.exact_memory_bound is not None:
        changes["exact_memory_bound"] = parse_bytes(args.exact_memory_bound)
    if args.no_backward:
        changes["backward"] = False
    if args.no_memory:
        changes["memory"] = False
    settings = dataclasses.replace(settings, **changes)
    if settings.hidden_dim % settings.heads:
        raise ValueError(f"--hidden-dim {settings.hidden_dim} is not divisible by --heads {settings.heads}")
    sweeps = args.sweeps or complexity.SWEEPS
    return complexity.run_complexity(settings, sweeps=sweeps, progress=_progress(args)), draw_complexity


def _paper(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench.paper import run_paper
    from polyfuse.figures.benchmarks import draw_paper

    payload = run_paper(lengths=tuple(args.lengths), repeats=args.repeats, warmup=args.warmup,
                        timing=not args.no_timing, progress=_progress(args))
    return payload, draw_paper


def _approximation(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import approximation
    from polyfuse.figures.benchmarks import draw_approximation

    if args.checkpoint is not None:
        payload = approximation.trained_model_errors(args.checkpoint, split=args.split, source=args.data)
        for key, value in payload.items():
            print(f"{key}: {value}")
        return payload, None
    settings = approximation.QUICK if args.preset == "quick" else approximation.FULL
    changes = {name: getattr(args, name) for name in
               ("modalities", "random_features", "scales", "seeds", "kernel_draws", "seed",
                "choice_random_features", "task_epochs", "task_seeds")
               if getattr(args, name) is not None}
    settings = dataclasses.replace(settings, **changes)
    payload = approximation.run_approximation(settings, progress=_progress(args))
    print(payload["table"])
    print()
    print(payload["choice_table"])
    return payload, draw_approximation


def _targets(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench.targets import QUICK_SIZES, run_targets

    sizes = QUICK_SIZES if args.quick else None
    payload = run_targets(repeats=args.repeats, warmup=args.warmup, sizes=sizes, threads=args.threads or 2,
                          progress=_progress(args))
    return payload, None


def _maf(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import maf

    payload = maf.run_maf_bench(args.runs, split=args.split, progress=_progress(args))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "maf.md").write_text(payload["table"], encoding="utf-8")
    print(payload["table"], end="")
    return payload, None


def _compile(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench.compile import run_compile_bench

    payload = run_compile_bench(args.modules, batch=args.batch, repeats=args.repeats, warmup=args.warmup,
                                mode=None if args.mode == "default" else args.mode, device=args.device,
                                training=args.train, backend=args.backend, time_budget_s=args.time_budget,
                                progress=_progress(args))
    # A GPU run, or one in another mode, does not replace the CPU default-mode result.
    args.result_name = "compile" + ("_cuda" if payload["settings"]["device"].startswith("cuda") else "") + (
        "" if args.mode == "default" else "_" + args.mode.replace("-", "_"))
    print(payload["table"])
    return payload, None


def _peers(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench.peers import (
        MODES,
        compare_to_baseline,
        format_table,
        markdown_report,
        run_peers,
    )

    if args.threads is not None:
        raise ValueError("bench peers: use --thread-counts (it times every count in turn), not --threads")
    import torch

    from polyfuse.bench.measure import bench_device

    device = bench_device(args.device)
    on_gpu = device.type == "cuda"
    # What is not given: the baseline's with --against, else the defaults.
    chosen = {"rows": None, "threads": (torch.get_num_threads(),) if on_gpu else (1, 2), "batch_sizes": None,
              "modes": MODES, "memory": ("ban_vqa", "ban_small")}
    baseline = _peers_baseline(args)
    if baseline is not None:
        settings = baseline["settings"]
        if torch.device(settings["device"]).type != device.type:
            raise ValueError(f"{args.against} was measured on {settings['device']}, this run is on {device}")
        chosen |= {"rows": list(dict.fromkeys(row["name"] for row in baseline["rows"])),
                   "threads": settings["threads"], "batch_sizes": settings["batch_sizes"],
                   "modes": settings["modes"], "memory": settings["memory_rows"]}
    given = {"rows": args.rows, "threads": args.thread_counts, "batch_sizes": args.batch_sizes, "modes": args.modes,
             "memory": None if args.memory is None else [row for row in args.memory if row != "none"]}
    chosen |= {key: value for key, value in given.items() if value is not None}
    paths = {"man": args.man, "ban_vqa": args.ban_vqa, "multibench": args.multibench}
    payload = run_peers(paths, **chosen, warmup=args.warmup, repeats=args.repeats, tolerance=args.tolerance,
                        time_unequal=args.time_unequal, profile=args.profile, progress=_progress(args),
                        device=device)
    if baseline is not None:
        args.changes = compare_to_baseline(payload, baseline)
    print(format_table(payload))
    words = ["polyfuse bench peers"] + [f"--{key.replace('_', '-')} {value}" for key, value in paths.items()
                                         if value is not None]
    if on_gpu:
        words.append(f"--device {args.device}")
    if args.rows:
        words.append("--rows '" + " ".join(args.rows) + "'")
    if args.batch_sizes:
        words.append("--batch-sizes '" + " ".join(map(str, args.batch_sizes)) + "'")
    if args.thread_counts is not None:
        words.append("--thread-counts '" + " ".join(map(str, args.thread_counts)) + "'")
    if args.modes is not None:
        words.append("--modes '" + " ".join(args.modes) + "'")
    if args.memory is not None:
        words.append("--memory '" + " ".join(args.memory) + "'")
    if args.against is not None:
        words.append(f"--against {args.against}")
    for option, default in (("repeats", 15), ("warmup", 3), ("tolerance", 1e-5), ("profile", 0)):
        if getattr(args, option) != default:
            words.append(f"--{option} {getattr(args, option)}")
    if args.time_unequal:
        words.append("--time-unequal")
    command = " ".join([*words, f"--output-dir {args.output_dir}"])
    args.result_name = "peers_cuda" if on_gpu else "peers"  # a GPU run does not replace the CPU one
    report = args.output_dir / f"{args.result_name}.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(markdown_report(payload, command), encoding="utf-8")
    print(f"wrote {report}")
    return payload, None


def _peers_baseline(args: argparse.Namespace) -> dict[str, Any] | None:
    from polyfuse.bench.peers import read_peers_result

    if args.result is not None and args.against is None:
        raise ValueError("bench peers: --result NEW.json is compared with --against BASELINE.json; give both")
    return None if args.against is None else read_peers_result(args.against)


def _report_changes(changes: list[Change], baseline: Path) -> int:
    """Print the ratios against the baseline; 1 (and a line on stderr naming the rows)
    when one regressed, else 0."""
    from polyfuse.bench.peers import format_changes

    print(f"against {baseline} (polyfuse / peer; a regression: more than 15% worse, or crossing 1.0):")
    for line in format_changes(changes):
        print(line)
    failed = [change for change in changes if change.failed]
    if failed:
        rows = ", ".join(dict.fromkeys(change.row for change in failed))
        print(f"polyfuse bench peers: {len(failed)} of {len(changes)} ratios regressed against {baseline}: {rows}",
              file=sys.stderr)
        return 1
    missing = sum(change.old is None or change.new is None for change in changes)
    print(f"no regression: {len(changes) - missing} ratios compared" + (
        f", {missing} missing on one side" if missing else ""))
    return 0


def _ops(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from polyfuse.bench import dispatch

    settings = dispatch.OpsSettings(batch=args.batch, dims=tuple(args.dims), lengths=tuple(args.lengths),
                                    out_dim=args.out_dim, seed=args.seed, top=args.top)
    baseline = None if args.baseline is None else dispatch.read_baseline(args.baseline)
    payload = dispatch.run_ops_bench(args.modules, settings, baseline=baseline, progress=_progress(args))
    payload["settings"]["baseline_file"] = None if args.baseline is None else str(args.baseline)
    print("\n".join(dispatch.ops_markdown(payload)))
    return payload, None


_RUNNERS = {"complexity": _complexity, "paper": _paper, "approximation": _approximation,
            "targets": _targets, "maf": _maf, "compile": _compile, "peers": _peers,
            "captioning": _captioning, "ops": _ops, "gpu": _gpu, "ddp": _ddp, "data": _data}


def run(args: argparse.Namespace) -> int:
    import torch

    from polyfuse.bench.results import write_results

    if args.benchmark == "peers" and args.result is not None:  # two results compared, nothing measured
        from polyfuse.bench.peers import compare_to_baseline, read_peers_result

        baseline = _peers_baseline(args)
        return _report_changes(compare_to_baseline(read_peers_result(args.result), baseline), args.against)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    payload, plot = _RUNNERS[args.benchmark](args)
    name = getattr(args, "result_name", None) or args.benchmark
    path = write_results(args.output_dir / f"{name}.json", payload)
    print(f"wrote {path}")
    if plot is not None and not args.no_plots:
        try:
            for figure in plot(payload, args.output_dir):
                print(f"wrote {figure}")
        except ImportError:
            print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
    if args.benchmark == "targets":
        for name, target in payload["targets"].items():
            verdict = "pass" if target["passed"] else "FAIL"
            print(f"{name}: {target['value']:.3g} (target {target['direction']} "
                  f"{target['threshold']}) {verdict}")
    if args.benchmark == "peers" and args.against is not None:
        return _report_changes(args.changes, args.against)
    return 0
