"""Report a diverging optimiser as divergence, not as bad input.

Without this, NaN weights after a too-large step surface one step later as
"modality 0 contains NaN" from the fusion module's input check, which blames
the data.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from polyfuse.engine.errors import DivergenceError

__all__ = ["DivergenceError", "DivergenceGuard", "divergence_message"]


def divergence_message(step: int, what: str) -> str:
    return (
        f"{what} became NaN or Inf at training step {step}: the optimisation diverged; "
        "lower the learning rate (optim.lr) or clip gradients (trainer.gradient_clip_val)"
    )


class DivergenceGuard(Callback):
    """Stop with :class:`DivergenceError` when the loss or a weight stops being finite."""

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        step = int(trainer.global_step)
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
            raise DivergenceError(divergence_message(step, "the loss"))
        for name, parameter in module.named_parameters():
            if not bool(torch.isfinite(parameter.detach()).all()):
                raise DivergenceError(divergence_message(step, f"the weight {name!r}"))
