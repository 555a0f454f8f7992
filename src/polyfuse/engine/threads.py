"""CPU threads of a run: never more busy threads than the cores this process may use.

A run has ``processes`` processes (``trainer.devices``: DDP starts one per device),
each with torch's intra-op pool (the threads one operator uses), its inter-op pool
(operators run concurrently) and ``loader_workers`` data loader processes (one thread
each: PyTorch sets their torch threads to 1), chosen by
:func:`polyfuse.data.loading.default_loader_workers` unless ``data.loader_workers`` is set. On a shared machine a pool larger than
the free cores does not run faster but much slower: threads that wait for each other
at every operator are descheduled in turn (measured: 15 to 30 times slower
training with 2 threads than with 1 on a loaded 2-core machine).

The default therefore divides the free cores (``os.sched_getaffinity``, which honours
taskset, cgroup cpusets and container limits, not ``os.cpu_count``) among the
processes and gives each one inter-op thread, its loader workers and the rest as
intra-op threads, at least 1:

    per process = max(1, cores // processes)
    inter-op = 1, intra-op = max(1, per process - 1 - loader_workers)

so that ``processes * (intra + inter + loader_workers) <= cores`` whenever
``cores >= 2 * processes`` (below that, 1 + 1 per process is the least torch allows).
A ``trainer.num_threads`` set in the config is used as given, with a warning when it
oversubscribes.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import torch

from polyfuse.data.loading import free_cores, loader_workers_of

__all__ = ["ThreadPlan", "apply_thread_plan", "free_cores", "plan_threads", "thread_plan_for"]


@dataclass(frozen=True)
class ThreadPlan:
    """Threads per process and what they were chosen from."""

    intra_op: int
    inter_op: int
    processes: int
    loader_workers: int
    cores: int
    chosen_by: str  # "default" or "trainer.num_threads"

    @property
    def busy(self) -> int:
        """Threads and worker processes of the whole run."""
        return self.processes * (self.intra_op + self.inter_op + self.loader_workers)

    @property
    def oversubscribed(self) -> bool:
        return self.busy > self.cores

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"busy": self.busy, "oversubscribed": self.oversubscribed}

    def describe(self) -> str:
        """One line for the run's output."""
        line = (f"threads: {self.intra_op} intra-op + {self.inter_op} inter-op per process, "
                f"{self.processes} process{'es' if self.processes > 1 else ''}, "
                f"{self.loader_workers} data loader workers, {self.cores} free cores "
                f"({'set by trainer.num_threads' if self.chosen_by != 'default' else 'default'})")
        if self.oversubscribed:
            line += (f"; WARNING: {self.busy} busy threads on {self.cores} cores oversubscribe the "
                     "machine, which can make training many times slower")
        return line


def plan_threads(
    num_threads: int | None,
    *,
    processes: int = 1,
    loader_workers: int = 0,
    cores: int | None = None,
) -> ThreadPlan:
    """The threads of a run (see the module doc). ``num_threads`` is
    ``trainer.num_threads`` (None: the default); ``cores`` None reads the affinity."""
    if processes < 1 or loader_workers < 0:
        raise ValueError(f"processes must be >= 1 and loader_workers >= 0, got {processes} and {loader_workers}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"trainer.num_threads must be >= 1, got {num_threads}")
    cores = free_cores() if cores is None else int(cores)
    per_process = max(1, cores // processes)
    inter_op = 1
    if num_threads is None:
        intra_op, chosen_by = max(1, per_process - inter_op - loader_workers), "default"
    else:
        intra_op, chosen_by = int(num_threads), "trainer.num_threads"
    return ThreadPlan(intra_op, inter_op, processes, loader_workers, cores, chosen_by)


def thread_plan_for(config: Any) -> ThreadPlan:
    """The plan of a run from its configuration (``trainer.num_threads``,
    ``trainer.devices``, ``data.loader_workers``)."""
    trainer = config["trainer"]
    return plan_threads(trainer["num_threads"], processes=int(trainer["devices"]), loader_workers=loader_workers_of(config))


def apply_thread_plan(plan: ThreadPlan) -> dict[str, int]:
    """Set torch's pools of this process to the plan; returns what torch then uses.

    The inter-op pool can be sized once per process, before it starts: if that is
    past, it keeps its size, which the result reports."""
    torch.set_num_threads(plan.intra_op)
    if torch.get_num_interop_threads() != plan.inter_op:
        with contextlib.suppress(RuntimeError):  # already started or set in this process
            torch.set_num_interop_threads(plan.inter_op)
    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
