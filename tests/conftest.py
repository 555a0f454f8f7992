"""Fixtures shared by the test folders: a witness of a training run, the tiny
configuration of a task type under the test's temporary folder, a free TCP port. The data
behind them is in tests/tiny/ and tests/helpers/, which test files may import; no test
file imports another."""

import math

import pytest
import torch
from tests.helpers.ports import free_port as _free_port


class TrainingWitness:
    """Records a Lightning run: every trainable parameter before and after training and the
    loss of every training step, per epoch (a Lightning callback, built by
    :func:`training_witness`)."""

    def __init__(self):
        self.before, self.after, self.epochs = {}, {}, []

    def assert_trained(self, *, loss_falls=True):
        """Finite losses at every step, finite float32 weights, at least half of the
        parameter tensors moved, and (``loss_falls``) a last epoch's mean loss below the
        first's."""
        losses = [loss for epoch in self.epochs for loss in epoch]
        assert losses and all(math.isfinite(loss) for loss in losses), self.epochs
        assert self.before.keys() == self.after.keys() and self.after
        assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in self.after.values())
        moved = [name for name in self.after if not torch.equal(self.before[name], self.after[name])]
        assert len(moved) >= len(self.after) / 2, f"only {moved} changed"
        if loss_falls:
            first, last = (sum(epoch) / len(epoch) for epoch in (self.epochs[0], self.epochs[-1]))
            assert len(self.epochs) > 1 and last < first, self.epochs


@pytest.fixture
def training_witness():
    """A callback to pass to ``polyfuse.engine.train(..., callbacks=[...])``; call its
    ``assert_trained()`` after the run."""
    from lightning.pytorch.callbacks import Callback

    class Witness(TrainingWitness, Callback):
        def _weights(self, module):
            return {name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad}

        def on_train_start(self, trainer, module):
            self.before = self._weights(module)

        def on_train_epoch_start(self, trainer, module):
            self.epochs.append([])

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_index):
            self.epochs[-1].append(float(outputs["loss"]))

        def on_train_end(self, trainer, module):
            self.after = self._weights(module)

    return Witness()


@pytest.fixture
def tiny_task(tmp_path):
    """``tiny_task(name)``: the tiny configuration of task type ``name``
    (:data:`tests.tiny.tasks.TINY`), its files written under the test's ``tmp_path``."""
    from tests.tiny.tasks import TINY  # here: the tiny data's imports only where a test asks

    return lambda name: TINY[name](tmp_path)


@pytest.fixture
def free_port() -> int:
    """A TCP port free on the loopback interface, for one multi-process run's rendezvous."""
    return _free_port()
