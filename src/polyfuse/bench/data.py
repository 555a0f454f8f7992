"""``polyfuse bench data``: every task's training loader, its peak memory and items per second.

For each task type (the ``polyfuse bench ddp`` tasks, and ``vqa-bottom-up``: a VQA 2.0-like
set of 2048-d bottom-up features, 10 to 100 boxes per image, in ban-vqa's adaptive HDF5
layout, written by :func:`polyfuse.data.synthetic_vqa.write_vqa2_like`), the data set is
written at two sizes, N and 4N items (:data:`BASE_SIZES`), and at each size the training
loader is built and read once through (at most ``max_batches`` batches) with 0 and with 2
loader workers (``data.loader_workers``), each measurement in a new process, so that its
peak memory is its own: a process forked from a fork server (``python -m
polyfuse.bench.data --serve``, started once) that has imported the libraries and nothing
else (no data, no tensors: the import of torch and Lightning, seconds each on a loaded
2-core machine, is paid once, not per measurement), or with ``fresh_interpreter`` a new
interpreter (``python -m polyfuse.bench.data --worker JOB RESULT``). Either way the process
starts from the same memory, that of the imports:

* ``peak_rss``: the process's peak resident size (``getrusage(RUSAGE_SELF).ru_maxrss``),
  building the data included; ``peak_rss_built`` the same read after building, before the
  first batch (what reading the epoch added is the difference);
* ``children_maxrss``: ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` after the pass (the largest
  ended child: a loader worker; in a new interpreter also the ``uname -p`` that ``platform``
  forks from the whole interpreter at import: ``children_maxrss_before`` is its value before
  the loader starts); ``workers_memory``: each worker's own peak resident size (``VmHWM``, which
  counts the pages it shares with the main process after the fork) and the largest of its
  private memory (``Private_Clean + Private_Dirty`` of ``smaps_rollup``, sampled after every
  batch at most every 0.2 s and at the last batch): what a worker costs beyond the main
  process;
* ``items_per_second``: the items (the rows the batch sampler draws) after the first batch
  over the time after the first batch; ``first_batch_seconds``: the first batch's latency
  from the loader's iterator creation (the workers' start included).

Then, once per task in a new process at size N, the training step: the task's Lightning
module for the configuration's model (the default model of the configuration: for
``vqa-bottom-up`` BAN at the default sizes), ``training_step`` + backward (+ the configured
gradient clipping) + the optimiser's step on batches fetched beforehand, ``warmup_steps``
untimed, then at least ``min_steps`` and up to ``max_steps`` timed (until ``step_seconds``
have passed), with all the cores (``torch.set_num_threads``; ``--threads`` to change).
``ratio`` is the loader's items per second with the most workers at 4N over the training
step's: above 1 the loader keeps up with training (target, at least 2 for ``vqa-bottom-up``
with 2 workers). The machine's load is recorded with the result.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from polyfuse.bench.ddp import TASKS as DDP_TASKS
from polyfuse.bench.ddp import task_config
from polyfuse.bench.measure import LoadMonitor
from polyfuse.bench.results import result_header

__all__ = [
    "BASE_SIZES", "FULL", "QUICK", "TASKS", "DataBenchSettings", "data_markdown", "measure_loader", "measure_step",
    "run_data_bench", "task_row", "write_task",
]

BOTTOM_UP = "vqa-bottom-up"
TASKS = (*DDP_TASKS, BOTTOM_UP)
#: N of each task: the ``scale`` of :func:`polyfuse.bench.ddp.task_config` (the training items at
#: scale 1: tabular 2240, vqa 2880 questions, captioning 1728 caption pairs, retrieval 7680
#: videos, chimera 960 pairs, grounding 600 images of 5 captions), or for ``vqa-bottom-up`` the
#: training images (5 questions each)
BASE_SIZES: dict[str, float] = {"sentiment": 1.0, "traits": 1.0, "classification": 1.0, "vqa": 1.0,
                                "captioning": 1.0, "retrieval": 0.25, "chimera": 1.0, "grounding": 1.0, BOTTOM_UP: 500}
FACTORS = (1, 4)  # the sizes measured: N and 4N
_MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class DataBenchSettings:
    tasks: tuple[str, ...] = TASKS
    scale: float = 1.0  # multiplies every task's N
    workers: tuple[int, ...] = (0, 2)
    max_batches: int = 2000  # a loader pass reads at most this many batches
    warmup_steps: int = 2
    min_steps: int = 3
    max_steps: int = 20
    step_seconds: float = 2.0  # timed training steps stop after this long (at least min_steps)
    step_threads: int | None = None  # torch threads of the training step (None: the free cores)
    seed: int = 0
    timeout_s: float = 900.0  # per measuring process
    fresh_interpreter: bool = False  # each measurement a new interpreter (python -m ...), not a fork-server fork


FULL = DataBenchSettings()
QUICK = dataclasses.replace(FULL, tasks=("sentiment",), scale=0.1, max_steps=5, step_seconds=0.5)


# -- the data sets ---------------------------------------------------------------------
def write_task(name: str, folder: Path, *, size: float, seed: int = 0) -> dict[str, Any]:
    """Write task ``name``'s synthetic data of ``size`` (a ddp ``scale``; for
    ``vqa-bottom-up`` the training images) into ``folder``; its configuration."""
    folder.mkdir(parents=True, exist_ok=True)
    if name != BOTTOM_UP:
        config = task_config(name, folder, scale=size, seed=seed)
    else:
        from polyfuse.data.synthetic_vqa import write_vqa2_like

        images = max(8, round(size))
        paths = write_vqa2_like(folder, images={"train": images, "val": max(8, images // 10)}, feature_dim=2048,
                                min_boxes=10, max_boxes=100, seed=seed, splits=("train", "val"), formats=("hdf5",))
        files: dict[str, Any] = {}
        for split, role in (("train", "train"), ("val", "test")):
            written = paths[split]
            files |= {f"{role}_questions": str(written["questions"]), f"{role}_annotations": str(written["annotations"]),
                      f"{role}_features": str(written["hdf5"]), f"{role}_features_index": str(written["index"])}
        config = {"task": {"type": "vqa"}, "data": {"vqa": {**files, "min_answer_count": 1}},
                  "model": {"fusion": "ban"}, "seed": seed, "output_dir": str(folder / "runs"),
                  "trainer": {"accelerator": "cpu", "progress_bar": False, "quiet": True}}
    config["trainer"] = {**config.get("trainer", {}), "accelerator": "cpu"}
    return config


def _with_workers(config: Mapping[str, Any], workers: int) -> dict[str, Any]:
    return {**config, "data": {**config.get("data", {}), "loader_workers": int(workers)}}


# -- one measurement (in the measuring process, or in-process in the tests) --------------
def _build(config: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(resolved configuration, task spec, TaskData) with the data module set up for fitting."""
    from polyfuse.engine import resolve_config
    from polyfuse.tasks.registry import task_spec

    resolved = resolve_config(dict(config))
    spec = task_spec(resolved["task"]["type"])
    data = spec.build_data(resolved)
    data.datamodule.prepare_data()
    data.datamodule.setup("fit")
    return resolved, spec, data


def _batch_items(loader: Any) -> list[int]:
    """The items of each batch of one pass of ``loader``: the index lists its batch sampler
    draws (read in this process; the batches themselves are not made)."""
    if loader.batch_sampler is None:  # no automatic batching: every item is a batch
        return [1] * len(loader)
    return [len(indices) for indices in loader.batch_sampler]


def _peak_rss(who: int = resource.RUSAGE_SELF) -> int:
    """``ru_maxrss`` in bytes (Linux reports KiB)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(who).ru_maxrss) * scale


def _children() -> list[int]:
    """The pids of this process's children (the loader workers), from /proc."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as handle:
                pids += [int(pid) for pid in handle.read().split()]
    return sorted(set(pids))


def _proc_kib(path: str, keys: Iterable[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    with contextlib.suppress(OSError), open(path) as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in keys:
                found[key] = int(rest.split()[0]) * 1024
    return found


class _WorkerMemory:
    """The loader workers' peak resident size (VmHWM) and largest private memory, sampled."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s, self.last = every_s, -float("inf")
        self.peak: dict[int, int] = {}
        self.private: dict[int, int] = {}

    def sample(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        for pid in _children():
            status = _proc_kib(f"/proc/{pid}/status", ("VmHWM",))
            if "VmHWM" in status:
                self.peak[pid] = max(self.peak.get(pid, 0), status["VmHWM"])
            rollup = _proc_kib(f"/proc/{pid}/smaps_rollup", ("Private_Clean", "Private_Dirty"))
            if rollup:
                self.private[pid] = max(self.private.get(pid, 0), sum(rollup.values()))

    def result(self) -> list[dict[str, int]]:
        return [{"pid": pid, "peak_rss": self.peak[pid], "private": self.private.get(pid, 0)} for pid in sorted(self.peak)]


def measure_loader(config: Mapping[str, Any], *, max_batches: int = FULL.max_batches) -> dict[str, Any]:
    """Build ``config``'s data and read its training loader once (at most ``max_batches``
    batches): the module docstring's numbers of one measurement."""
    from polyfuse.engine import resolve_config
    from polyfuse.tasks.registry import task_spec

    del resolve_config, task_spec  # imported first: the imports are not the data's building time

    children_before = _peak_rss(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    resolved, _, data = _build(config)
    build_seconds = time.perf_counter() - start
    peak_built = _peak_rss()
    loader = data.datamodule.train_dataloader()
    sizes = _batch_items(loader)[:max_batches]
    memory = _WorkerMemory()
    children_loader = _peak_rss(resource.RUSAGE_CHILDREN)
    items = batches = 0
    first_seconds = first_items = None
    start = time.perf_counter()
    for batch in islice(loader, len(sizes)):
        del batch
        items += sizes[batches]
        batches += 1
        if first_seconds is None:
            first_seconds, first_items = time.perf_counter() - start, items
        memory.sample(force=batches in (1, len(sizes)))
    seconds = time.perf_counter() - start
    after_first = seconds - (first_seconds or 0.0)
    rate = (items - first_items) / after_first if batches > 1 and after_first > 0 else None
    return {
        "workers": int(resolved["data"].get("loader_workers") or 0),
        "samples": dict(data.samples),
        "batches": batches,
        "batches_per_epoch": len(loader),
        "items": items,
        "capped": batches < len(loader),
        "build_seconds": build_seconds,
        "seconds": seconds,
        "first_batch_seconds": first_seconds,
        "items_per_second": rate,
        "peak_rss_built": peak_built,
        "peak_rss": _peak_rss(),
        "children_maxrss_before": children_before,
        "children_maxrss_loader_start": children_loader,
        "children_maxrss": _peak_rss(resource.RUSAGE_CHILDREN),
        "workers_memory": memory.result(),
    }


def _optimizers(configured: Any) -> list[Any]:
    """The optimisers of what ``configure_optimizers`` returns, in the forms Lightning
    accepts: one, a list or tuple of them, a dict with ``optimizer``, a list of such
    dicts, or two lists (optimisers, schedulers)."""
    import torch

    if configured is None:
        return []
    if isinstance(configured, torch.optim.Optimizer):
        return [configured]
    if isinstance(configured, Mapping):
        return _optimizers(configured["optimizer"])
    if isinstance(configured, list | tuple):
        if len(configured) == 2 and isinstance(configured[0], list | tuple):
            return _optimizers(list(configured[0]))  # ([optimisers], [schedulers])
        return [optimizer for item in configured for optimizer in _optimizers(item)]
    raise TypeError(f"configure_optimizers returned {type(configured).__name__}, not an optimiser")


def measure_step(config: Mapping[str, Any], *, warmup_steps: int = FULL.warmup_steps, min_steps: int = FULL.min_steps,
                 max_steps: int = FULL.max_steps, step_seconds: float = FULL.step_seconds,
                 threads: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Items per second of ``config``'s training step (module docstring), on
    ``warmup_steps + min_steps`` batches fetched beforehand (reused in turn)."""
    import torch

    from polyfuse.data.loading import free_cores

    config = _with_workers(config, 0)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads or free_cores())
    try:
        torch.manual_seed(seed)
        resolved, spec, data = _build(config)
        module = spec.build_module(resolved, data)
        loader = data.datamodule.train_dataloader()
        sizes = _batch_items(loader)
        batches = list(islice(loader, warmup_steps + min_steps))
        if not batches:
            raise ValueError("the training loader yields no batch")
        optimizers = _optimizers(module.configure_optimizers())
        clip = resolved["trainer"].get("gradient_clip_val")
        module.train()
        times: list[float] = []
        items: list[int] = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*self.log.*")
            warnings.filterwarnings("ignore", message=".*self.trainer.*")
            step = 0
            while True:
                k = step % len(batches)
                begin = time.perf_counter()
                for optimizer in optimizers:
                    optimizer.zero_grad(set_to_none=True)
                output = module.training_step(batches[k], step)
                loss = output["loss"] if isinstance(output, Mapping) else output
                loss.backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
                for optimizer in optimizers:
                    optimizer.step()
                elapsed = time.perf_counter() - begin
                step += 1
                if step > warmup_steps:
                    times.append(elapsed)
                    items.append(sizes[k])
                    if len(times) >= max_steps or (len(times) >= min_steps and sum(times) >= step_seconds):
                        break
        return {
            "threads": torch.get_num_threads(),
            "parameters": sum(p.numel() for p in module.parameters()),
            "model": resolved.get("model", {}).get("fusion"),
            "warmup_steps": warmup_steps,
            "steps": len(times),
            "step_seconds": times,
            "items": sum(items),
            "items_per_second": sum(items) / sum(times),
            "peak_rss": _peak_rss(),
        }
    finally:
        torch.set_num_threads(previous)


# -- the benchmark ---------------------------------------------------------------------
def _measure(kind: str, config: Mapping[str, Any], settings: DataBenchSettings, scratch: Path,
             server: _ForkServer | None) -> dict[str, Any]:
    """One measurement in a new process (forked by ``server``, or with ``fresh_interpreter`` a
    new interpreter); a failure is recorded, not raised."""
    job, result, log = scratch / f"{kind}-job.json", scratch / f"{kind}-result.json", scratch / f"{kind}.log"
    options: dict[str, Any] = ({"max_batches": settings.max_batches} if kind == "loader" else
                               {"warmup_steps": settings.warmup_steps, "min_steps": settings.min_steps,
                                "max_steps": settings.max_steps, "step_seconds": settings.step_seconds,
                                "threads": settings.step_threads, "seed": settings.seed})
    job.write_text(json.dumps({"kind": kind, "config": config, "options": options}))
    result.unlink(missing_ok=True)
    start = time.perf_counter()
    if server is None:
        command = [sys.executable, "-m", "polyfuse.bench.data", "--worker", str(job), str(result)]
        try:
            with log.open("w") as output:
                code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, timeout=settings.timeout_s).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {settings.timeout_s:g} s"}
    else:
        code = server.run(job, result, log, settings.timeout_s)
        if code is None:
            return {"error": f"timed out after {settings.timeout_s:g} s"}
    wall = time.perf_counter() - start
    if code != 0 or not result.exists():
        text = log.read_text(errors="replace") if log.exists() else ""
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return {"error": (lines[-1] if lines else f"exit status {code}")[:500], "log_tail": text[-3000:],
                "wall_seconds": wall}
    return {**json.loads(result.read_text()), "wall_seconds": wall}


class _ForkServer:
    """``python -m polyfuse.bench.data --serve``: a new interpreter that imports the libraries
    once (torch, Lightning, the task types: seconds each on a loaded machine) and then forks
    one process per measurement, before any data, tensor or thread pool exists in it, so that
    every measurement starts from the memory of the imports alone."""

    def __init__(self, scratch: Path) -> None:
        self.log = (scratch / "fork-server.log").open("w")
        self.process = subprocess.Popen([sys.executable, "-m", "polyfuse.bench.data", "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)

    def _reply(self, timeout_s: float | None) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"bench data: the fork server ended (exit {self.process.wait()}); see {self.log.name}")
        return json.loads(line)

    def run(self, job: Path, result: Path, log: Path, timeout_s: float) -> int | None:
        """The exit status of the process measuring ``job``; None when it ran past ``timeout_s`` (killed)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps([str(job), str(result), str(log)]) + "\n")
        self.process.stdin.flush()
        started = self._reply(None)
        assert started is not None
        finished = self._reply(timeout_s)
        if finished is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(started["pid"]), signal.SIGKILL)
            self._reply(None)
            return None
        return int(finished["code"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _serve() -> int:
    """The fork server's loop: a job per line of stdin, ``{"pid"}`` when its process is forked
    and ``{"code"}`` when it has ended, a line each on stdout."""
    from polyfuse.engine import resolve_config
    from polyfuse.tasks.registry import task_spec

    del resolve_config, task_spec  # imported once, before the forks

    for line in sys.stdin:
        job, result, log = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the measuring process: its output goes to the log
            code = 1
            try:
                descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(descriptor, 1)
                os.dup2(descriptor, 2)
                code = _worker(Path(job), Path(result))
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
    return 0


def task_row(name: str, runs: dict[str, dict[str, Any]], step: dict[str, Any], settings: DataBenchSettings,
         write_seconds: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {"task": name, "base_size": BASE_SIZES[name] * settings.scale, "write_seconds": write_seconds,
                           "loader": runs, "step": step}
    top = f"{FACTORS[-1]}N-w{max(settings.workers)}"
    loader_rate = runs.get(top, {}).get("items_per_second")
    step_rate = step.get("items_per_second")
    row["ratio_of"] = top
    row["ratio"] = loader_rate / step_rate if loader_rate and step_rate else None
    growth: dict[str, Any] = {}
    for workers in settings.workers:
        small, large = runs.get(f"{FACTORS[0]}N-w{workers}", {}), runs.get(f"{FACTORS[-1]}N-w{workers}", {})
        if "peak_rss" in small and "peak_rss" in large:
            growth[f"w{workers}"] = {"bytes": large["peak_rss"] - small["peak_rss"],
                                     "factor": large["peak_rss"] / small["peak_rss"],
                                     "built_bytes": large["peak_rss_built"] - small["peak_rss_built"]}
    row["rss_growth"] = growth
    return row


def run_data_bench(settings: DataBenchSettings = FULL, *, folder: Path | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every task of ``settings.tasks``: its loader at N and 4N items with each number of
    workers, and its training step (module docstring)."""
    unknown = [name for name in settings.tasks if name not in TASKS]
    if unknown:
        raise ValueError(f"bench data: unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    if settings.scale <= 0:
        raise ValueError(f"bench data: scale must be > 0, got {settings.scale}")
    payload = result_header("data", dataclasses.asdict(settings))
    payload["base_sizes"] = {name: BASE_SIZES[name] for name in settings.tasks}
    rows = []
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="polyfuse-bench-data-"))
        server = None
        if not settings.fresh_interpreter:
            server = _ForkServer(Path(scratch))
            stack.callback(server.close)
        load = stack.enter_context(LoadMonitor())
        root = Path(folder) if folder is not None else Path(scratch)
        for name in settings.tasks:
            work = root / name
            runs: dict[str, dict[str, Any]] = {}
            configs: dict[int, dict[str, Any]] = {}
            written: dict[str, float] = {}
            for factor in FACTORS:
                start = time.perf_counter()
                try:
                    configs[factor] = write_task(name, work / f"{factor}N", size=BASE_SIZES[name] * settings.scale * factor,
                                                 seed=settings.seed)
                except Exception as error:  # another task's data still gets measured
                    for workers in settings.workers:
                        runs[f"{factor}N-w{workers}"] = {"error": f"writing the data: {type(error).__name__}: {error}"[:500]}
                    continue
                written[f"{factor}N"] = time.perf_counter() - start
                for workers in settings.workers:
                    key = f"{factor}N-w{workers}"
                    runs[key] = _measure("loader", _with_workers(configs[factor], workers), settings, work, server)
                    if progress:
                        progress(f"{name} {key}: " + _describe_loader(runs[key]))
            step = (_measure("step", configs[FACTORS[0]], settings, work, server) if FACTORS[0] in configs
                    else {"error": "no data written"})
            row = task_row(name, runs, step, settings, written)
            rows.append(row)
            if progress:
                ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.1f}"
                detail = step.get("error") or f"{step['items_per_second']:.1f} items/s"
                progress(f"{name} training step: {detail}; ratio {ratio}")
            if folder is None:
                shutil.rmtree(work, ignore_errors=True)  # the 4N bottom-up features are a gigabyte
    payload["rows"], payload["load"] = rows, load.result()
    return payload


def _describe_loader(run: Mapping[str, Any]) -> str:
    if "error" in run:
        return f"failed: {run['error']}"
    rate = run["items_per_second"]
    return (f"{run['items']} items, {'n/a' if rate is None else f'{rate:.0f}'} items/s, "
            f"peak RSS {run['peak_rss'] / _MIB:.0f} MiB")


# -- the report ------------------------------------------------------------------------
def _mib(run: Mapping[str, Any] | None, key: str = "peak_rss") -> str:
    if not run or run.get(key) is None:
        return "failed" if run and "error" in run else "n/a"
    return f"{run[key] / _MIB:.0f}"


def _workers_private(run: Mapping[str, Any] | None) -> int | None:
    if not run or "workers_memory" not in run or not run["workers_memory"]:
        return None
    return sum(worker["private"] for worker in run["workers_memory"])


def _with_workers_rss(run: Mapping[str, Any] | None) -> str:
    """Main process peak + the workers' private memory, MiB."""
    main = _mib(run)
    private = _workers_private(run)
    return main if private is None else f"{main} + {private / _MIB:.0f}"


def _rate(run: Mapping[str, Any] | None) -> str:
    if not run or run.get("items_per_second") is None:
        return "failed" if run and "error" in run else "n/a"
    return f"{run['items_per_second']:.0f}"


def _items(run: Mapping[str, Any] | None) -> str:
    if not run or "items" not in run:
        return "?"
    return f"{run['items']}" + ("*" if run.get("capped") else "")


def data_markdown(payload: dict[str, Any], command: str = "polyfuse bench data --output-dir docs/benchmarks") -> str:
    """The section of docs/BENCHMARKS.md."""
    settings, machine, load = payload["settings"], payload["machine"], payload.get("load") or {}
    workers = settings["workers"]
    few, most = min(workers), max(workers)
    busy = load.get("machine_busy")
    load_text = (f"machine busy {100 * busy:.0f}% of all CPUs (the measuring processes and other jobs), "
                 f"load average {load['loadavg_1min']:.2f} at the end" if busy is not None else "load not recorded")
    lines = [
        "## Data loading: every task's loader beside its training step",
        "",
        "```bash",
        command,
        "python scripts/write_benchmarks_md.py",
        "```",
        "",
        "Every task's synthetic data (the `polyfuse bench ddp` sets, and **vqa-bottom-up**: VQA 2.0-like "
        "questions on 2048-d bottom-up features, 10 to 100 boxes per image, ban-vqa's adaptive HDF5) written "
        f"at N and 4N items (scale {settings['scale']:g}), its training loader built and read once with "
        f"{' and '.join(map(str, workers))} loader workers (`data.loader_workers`), each in a new process "
        + ("(`python -m polyfuse.bench.data --worker`)" if settings.get("fresh_interpreter") else
           "(forked from a fork server that has imported the libraries only)")
        + ". Peak RSS: the process's `ru_maxrss` (building "
        f"the data included); with workers, main process + the workers' private memory (each worker's largest "
        "Private_Clean + Private_Dirty, sampled; a forked worker also maps the main process's pages, not counted "
        "again). Items/s: the rows the batch sampler draws after the first batch over the time after it (at 4N). "
        "Training step: `training_step` + backward + optimiser step of the configuration's model (vqa-bottom-up: "
        f"BAN at the default sizes) on prefetched batches, {settings['warmup_steps']} warm-up steps, then "
        f"{settings['min_steps']} to {settings['max_steps']} timed, all cores. Ratio: loader items/s with "
        f"{most} workers at 4N / training step items/s (target: at least 2 for vqa-bottom-up with 2 workers; "
        "above 1 the loader keeps up).",
        "",
        f"Measured {payload['created']} (polyfuse {payload['polyfuse']}, torch {machine['torch']}) on "
        f"{machine['logical_cpus']} logical CPUs ({machine['cpu']}), shared with other jobs; {load_text}.",
        "",
        f"| task | items N / 4N | peak RSS (MiB) {few} workers N / 4N | {most} workers N / 4N "
        f"| items/s {few} / {most} workers | train step items/s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    growth_lines = []
    for row in payload["rows"]:
        runs = row["loader"]

        def run(factor: int, count: int, runs: dict[str, Any] = runs) -> dict[str, Any] | None:
            return runs.get(f"{factor}N-w{count}")

        step = row["step"]
        step_text = "failed" if "error" in step else f"{step['items_per_second']:.1f}"
        ratio = "n/a" if row.get("ratio") is None else f"{row['ratio']:.1f}"
        lines.append(
            f"| {row['task']} | {_items(run(1, few))} / {_items(run(4, few))} "
            f"| {_mib(run(1, few))} / {_mib(run(4, few))} "
            f"| {_with_workers_rss(run(1, most))} / {_with_workers_rss(run(4, most))} "
            f"| {_rate(run(4, few))} / {_rate(run(4, most))} | {step_text} | {ratio} |")
        parts = []
        for count in workers:
            grown = row.get("rss_growth", {}).get(f"w{count}")
            if grown:
                parts.append(f"{count} workers {grown['bytes'] / _MIB:+.0f} MiB (x{grown['factor']:.2f}; "
                             f"after building {grown['built_bytes'] / _MIB:+.0f} MiB)")
        first = [run(4, count) for count in workers]
        latency = " / ".join("n/a" if not r or r.get("first_batch_seconds") is None
                             else f"{1e3 * r['first_batch_seconds']:.0f}" for r in first)
        growth_lines.append(f"- {row['task']}: RSS growth from N to 4N: "
                            + ("; ".join(parts) if parts else "not measured")
                            + f"; first batch at 4N {latency} ms ({' / '.join(map(str, workers))} workers).")
    capped = any(r.get("capped") for row in payload["rows"] for r in row["loader"].values())
    if capped:
        lines += ["", f"\\* the pass stopped at {settings['max_batches']} batches."]
    failed = [(row["task"], key, r["error"]) for row in payload["rows"]
              for key, r in [*row["loader"].items(), ("step", row["step"])] if "error" in r]
    lines += ["", "RSS growth from N to 4N (the criterion: memory does not grow with the data; \"after building\": "
              "the peak read once the data is built, before the first batch) and the first batch's latency:", "",
              *growth_lines]
    bottom_up = next((row for row in payload["rows"] if row["task"] == BOTTOM_UP), None)
    if bottom_up is not None and bottom_up.get("ratio") is not None:
        verdict = "met" if bottom_up["ratio"] >= 2 and most == 2 else "not met"
        lines += ["", f"Target (vqa-bottom-up, 2 workers, loader at least 2x the BAN training step): "
                  f"ratio {bottom_up['ratio']:.1f}, **{verdict}**."]
    if failed:
        lines += ["", "Failed measurements:", ""] + [f"- {task} {key}: {error}" for task, key, error in failed]
    return "\n".join(lines) + "\n"


# -- the measuring process -------------------------------------------------------------
def _worker(job_path: Path, result_path: Path) -> int:
    job = json.loads(job_path.read_text())
    if job["kind"] == "loader":
        result = measure_loader(job["config"], **job["options"])
    elif job["kind"] == "step":
        result = measure_step(job["config"], **job["options"])
    else:
        raise ValueError(f"unknown measurement {job['kind']!r}")
    result_path.write_text(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one measurement of polyfuse bench data (started by the benchmark)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--worker", nargs=2, type=Path, metavar=("JOB", "RESULT"), help="one measurement")
    mode.add_argument("--serve", action="store_true", help="fork a process per job read from stdin")
    args = parser.parse_args(argv)
    return _serve() if args.serve else _worker(*args.worker)


if __name__ == "__main__":
    sys.exit(main())
