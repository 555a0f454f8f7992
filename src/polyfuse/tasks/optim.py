"""The optimiser and learning-rate schedule of every task type (the ``optim`` section).

:func:`build_optimizer` is what each task's ``configure_optimizers`` returns: the
optimiser named by ``optim.optimizer`` over the task's parameter groups (or a module's
trainable parameters), with the schedule named by ``optim.scheduler``.
:class:`OptimSettings` holds those choices (not the rates: ``optim.lr`` and
``optim.weight_decay`` are the defaults of groups that set none of their own).

Optimisers: ``adamw`` (``torch.optim.AdamW``, decoupled weight decay), ``adam``
(``torch.optim.Adam``, weight decay as an L2 term; Low-Rank HOCA section 5.2, MAN's
retrieval and Collaborative Experts, Chimera), ``adamax`` (ban-vqa's ``train.py``;
L2 weight decay).

Schedules, each a multiple of every group's own base rate:

- ``none``: the base rate throughout.
- ``cosine``: cosine annealing over ``trainer.max_epochs``, stepped per epoch.
- ``ban_warmup``: ban-vqa's warm-up and decay, stepped per epoch (:func:`ban_warmup_factor`).
- ``step``: ``decay_rate ** (k // decay_every)`` at optimiser step k (0-based: the rate of
  the update that follows k updates), ``torch.optim.lr_scheduler.StepLR`` stepped per
  optimiser step. MAN section 3.3 (retrieval) and Collaborative
  Experts: Adam at 5e-5, decayed by 0.95 every 1,000 optimisation steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "OPTIMIZERS", "SCHEDULERS", "OptimSettings", "ban_warmup_factor", "build_optimizer", "check_optimizer",
    "parameter_groups_of",
]

OPTIMIZERS = ("adamw", "adam", "adamax")
SCHEDULERS = ("none", "cosine", "ban_warmup", "step")
_KINDS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "adamax": torch.optim.Adamax}

# ban-vqa's train.py: lr_default times these in epochs 0-3 (gradual warm-up), then the
# last of them until epochs 10, 12, 14, 16, 18 (range(10, 20, 2)) each multiply it by 0.25.
_BAN_WARMUP = (0.5, 1.0, 1.5, 2.0)
_BAN_DECAY_EPOCHS = range(10, 20, 2)
_BAN_DECAY_RATE = 0.25


def ban_warmup_factor(epoch: int) -> float:
    """The multiple of the base learning rate in ``epoch`` (0-based) of ban-vqa's schedule
    (``train.py``): 0.5, 1, 1.5, 2 in epochs 0-3, 2 until epoch 9, then times 0.25 at
    epochs 10, 12, 14, 16 and 18 (2 x 0.25^5 from epoch 18 on). With ban-vqa's base
    1e-3 the peak is 2e-3; BAN section 5.4 writes min(i x 1e-3, 4e-3) for epoch i from 1
    and a decay of 1/4 every 2 epochs after 10, which is this schedule at base 2e-3."""
    if epoch < len(_BAN_WARMUP):
        return _BAN_WARMUP[epoch]
    decays = sum(1 for decay_epoch in _BAN_DECAY_EPOCHS if decay_epoch <= epoch)
    return _BAN_WARMUP[-1] * _BAN_DECAY_RATE**decays


def check_optimizer(optimizer: str, scheduler: str, max_epochs: int | None, *,
                    decay_rate: float | None = None, decay_every: int | None = None) -> None:
    """Refuse an unknown optimiser or schedule, cosine without ``max_epochs``, ``step``
    without a decay rate in (0, 1] and a period >= 1, or either of those with another schedule."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    if scheduler == "cosine" and not max_epochs:
        raise ValueError("the cosine scheduler needs max_epochs")
    if scheduler == "step":
        if decay_rate is None or decay_every is None:
            missing = "decay_rate" if decay_rate is None else "decay_every"
            raise ValueError(f"the step scheduler needs {missing} (lr x decay_rate every decay_every optimizer steps)")
        if not 0.0 < float(decay_rate) <= 1.0:
            raise ValueError(f"decay_rate must lie in (0, 1], got {decay_rate!r}")
        if isinstance(decay_every, bool) or int(decay_every) != decay_every or decay_every < 1:
            raise ValueError(f"decay_every must be an integer >= 1, got {decay_every!r}")
    else:
        for name, value in (("decay_rate", decay_rate), ("decay_every", decay_every)):
            if value is not None:
                raise ValueError(f"{name} is read only by the step scheduler, not by {scheduler!r}")


@dataclass(frozen=True)
class OptimSettings:
    """Which optimiser and schedule (the ``optim`` section less the rates): see the module
    docstring. ``max_epochs``: the length of the cosine schedule (``trainer.max_epochs``).
    The defaults, AdamW without a schedule, are those of a configuration that sets none."""

    optimizer: str = "adamw"
    scheduler: str = "none"
    max_epochs: int | None = None
    decay_rate: float | None = None
    decay_every: int | None = None

    def __post_init__(self) -> None:
        check_optimizer(self.optimizer, self.scheduler, self.max_epochs, decay_rate=self.decay_rate,
                        decay_every=self.decay_every)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OptimSettings:
        """The settings of a configuration (``optim`` and ``trainer.max_epochs``); a key that a
        partial configuration (one not validated, as in tests) lacks takes its default."""
        optim, trainer = config.get("optim") or {}, config.get("trainer") or {}
        return cls(optimizer=optim.get("optimizer", "adamw"), scheduler=optim.get("scheduler", "none"),
                   max_epochs=trainer.get("max_epochs"), decay_rate=optim.get("decay_rate"),
                   decay_every=optim.get("decay_every"))


def parameter_groups_of(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The trainable parameters of ``module`` in two groups: those at ``weight_decay``
    and the biases (names ending in ``bias``) without weight decay."""
    decay, no_decay = [], []
    for name, parameter in module.named_parameters():
        if parameter.requires_grad:
            (no_decay if name.endswith("bias") else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(params: nn.Module | Iterable[Mapping[str, Any]], settings: OptimSettings | None = None, *,
                    lr: float, weight_decay: float = 0.0) -> Any:
    """What ``configure_optimizers`` returns: the optimiser of ``settings`` over ``params``
    and its schedule.

    ``params``: a module (its trainable parameters, biases without weight decay:
    :func:`parameter_groups_of`) or parameter groups, taken as they are: a group without
    its own ``lr`` or ``weight_decay`` gets ``lr`` or ``weight_decay``. A schedule scales
    each group's own rate. Without a schedule the optimiser alone is returned, else
    Lightning's ``{"optimizer", "lr_scheduler": {"scheduler", "interval"}}`` (interval
    ``epoch`` for cosine and ban_warmup, ``step`` for step)."""
    settings = settings if settings is not None else OptimSettings()
    if isinstance(params, nn.Module):
        groups: list[Any] = parameter_groups_of(params, weight_decay)
    else:
        groups = [dict(group) for group in params]
    built = _KINDS[settings.optimizer](groups, lr=lr, weight_decay=weight_decay)
    if settings.scheduler == "none":
        return built
    interval = "epoch"
    if settings.scheduler == "cosine":
        schedule: Any = torch.optim.lr_scheduler.CosineAnnealingLR(built, T_max=int(settings.max_epochs))
    elif settings.scheduler == "ban_warmup":
        schedule = torch.optim.lr_scheduler.LambdaLR(built, ban_warmup_factor)
    else:
        schedule = torch.optim.lr_scheduler.StepLR(built, step_size=int(settings.decay_every),
                                                   gamma=float(settings.decay_rate))
        interval = "step"
    return {"optimizer": built, "lr_scheduler": {"scheduler": schedule, "interval": interval}}
