"""optim.optimizer and optim.scheduler reach the optimiser Lightning steps, epoch by epoch."""

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from polyfuse.engine.config import resolve_config
from polyfuse.engine.run import train


class LearningRates(Callback):
    """The optimiser's class and its learning rate at the start of each training epoch."""

    def __init__(self):
        self.kinds, self.lrs = [], []

    def on_train_epoch_start(self, trainer, module):
        optimizer = trainer.optimizers[0]
        self.kinds.append(type(optimizer))
        self.lrs.append(optimizer.param_groups[0]["lr"])


def test_adamax_and_ban_warmup_in_a_run(tiny_config, tmp_path):
    seen = LearningRates()
    config = tiny_config(optim={"optimizer": "adamax", "scheduler": "ban_warmup", "lr": 0.01},
                         trainer={"max_epochs": 5, "patience": 0})  # fmt: skip
    train(config, run_dir=tmp_path / "r", callbacks=[seen])
    assert seen.kinds == [torch.optim.Adamax] * 5
    assert seen.lrs == pytest.approx([0.005, 0.01, 0.015, 0.02, 0.02])  # ban-vqa's warm-up, by hand


def test_captioning_refuses_what_it_would_ignore():
    with pytest.raises(ValueError, match=r"task\.type captioning trains with AdamW and no schedule"):
        resolve_config({"task": {"type": "captioning"}, "optim": {"scheduler": "ban_warmup"},
                        "captioning": {"features": {"a": "a.npz"}, "captions": "c.json", "splits": "s.json"}})
