"""optim.optimizer and optim.scheduler reach the optimiser Lightning steps, epoch by epoch
or optimiser step by step, for every task type (polyfuse.tasks.optim)."""

import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tests.helpers.runs import Interrupt
from tests.tiny.tasks import TINY

from polyfuse.engine.checkpoints import read_checkpoint
from polyfuse.engine.config import resolve_config
from polyfuse.engine.run import train
from polyfuse.tasks.optim import OptimSettings, ban_warmup_factor, build_optimizer
from polyfuse.tasks.registry import task_spec


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




# ---- the step schedule ------------------------------------------------------------------------
def _lr_after(steps: int, configured) -> float:
    optimizer, schedule = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    for _ in range(steps):
        optimizer.step()
        schedule.step()
    return optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize(("step", "expected"), [(0, 5e-5), (999, 5e-5), (1000, 4.75e-5), (2500, 4.5125e-5)])
def test_step_decay_of_man_retrieval_by_hand(step, expected):
    # MAN section 3.3: Adam at 5e-5, x 0.95 every 1000 optimisation steps.
    # By hand: 5e-5 * 0.95 = 4.75e-5 from step 1000, 5e-5 * 0.9025 = 4.5125e-5 from step 2000.
    weight = torch.nn.Parameter(torch.zeros(1))
    settings = OptimSettings("adam", "step", decay_rate=0.95, decay_every=1000)
    configured = build_optimizer([{"params": [weight]}], settings, lr=5e-5)
    assert configured["lr_scheduler"]["interval"] == "step"
    assert _lr_after(step, configured) == pytest.approx(expected, rel=1e-12)
    assert type(configured["lr_scheduler"]["scheduler"]) is torch.optim.lr_scheduler.StepLR


def test_step_decay_scales_every_group_by_its_own_rate():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    configured = build_optimizer([{"params": [a]}, {"params": [b], "lr": 1e-2}],
                                 OptimSettings("adamw", "step", decay_rate=0.5, decay_every=3), lr=1e-3)
    _lr_after(7, configured)  # 7 // 3 = 2 decays
    assert [g["lr"] for g in configured["optimizer"].param_groups] == pytest.approx([1e-3 / 4, 1e-2 / 4])


# ---- Adam ----------------------------------------------------------------------------------------
def test_adam_is_torch_adam_with_l2_weight_decay_by_hand():
    """Two steps of Adam on loss = x^2 from x = 1 (lr 0.1, weight decay 0.5 as an L2 term),
    by the update of Kingma & Ba: g = 2x + 0.5x, m and v moving averages, bias-corrected."""
    x = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    optimizer = build_optimizer([{"params": [x]}], OptimSettings("adam"), lr=0.1, weight_decay=0.5)
    assert type(optimizer) is torch.optim.Adam
    lr, beta1, beta2, eps, decay = 0.1, 0.9, 0.999, 1e-8, 0.5
    value, m, v = 1.0, 0.0, 0.0
    for t in (1, 2):
        optimizer.zero_grad()
        (x**2).sum().backward()
        optimizer.step()
        g = 2 * value + decay * value
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        value -= lr * (m / (1 - beta1**t)) / (math.sqrt(v / (1 - beta2**t)) + eps)
        assert x.item() == pytest.approx(value, rel=1e-12, abs=1e-15)
    assert value == pytest.approx(0.8004122, abs=1e-6)  # 0.9, then 0.9 - 0.1 * 2.36842 / 2.37822
    # AdamW would decay x before its step: 0.95 - 0.1 = 0.85 after the first step, not 0.9
    y = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    adamw = build_optimizer([{"params": [y]}], OptimSettings("adamw"), lr=0.1, weight_decay=0.5)
    (y**2).sum().backward()
    adamw.step()
    assert y.item() == pytest.approx(0.85, abs=1e-7)


def test_default_settings_are_adamw_without_a_schedule():
    module = torch.nn.Linear(2, 1)
    configured = build_optimizer(module, lr=1e-3, weight_decay=0.1)
    assert type(configured) is torch.optim.AdamW
    assert [g["weight_decay"] for g in configured.param_groups] == [0.1, 0.0]  # no decay on the bias
    assert [len(g["params"]) for g in configured.param_groups] == [1, 1]


@pytest.mark.parametrize(("optim", "error"), [
    ({"scheduler": "step", "decay_every": 10}, r"optim\.decay_rate: optim\.scheduler step needs it"),
    ({"scheduler": "step", "decay_rate": 0.9}, r"optim\.decay_every: optim\.scheduler step needs it"),
    ({"scheduler": "cosine", "decay_rate": 0.9}, r"optim\.decay_rate is read only by optim\.scheduler step"),
    ({"decay_every": 5}, r"optim\.decay_every is read only by optim\.scheduler step \(scheduler is 'none'\)"),
    ({"scheduler": "step", "decay_rate": 0.0, "decay_every": 1}, r"'optim\.decay_rate': Input should be greater than 0"),
    ({"scheduler": "step", "decay_rate": 1.01, "decay_every": 1}, r"'optim\.decay_rate': Input should be less than or equal to 1"),
    ({"scheduler": "step", "decay_rate": 0.5, "decay_every": 0}, r"'optim\.decay_every': Input should be greater than or equal to 1"),
])
def test_step_decay_keys_are_checked(optim, error):
    with pytest.raises(ValueError, match=error) as caught:
        resolve_config({"optim": optim})
    assert "\n" not in str(caught.value)


def test_step_decay_keys_in_python_are_checked():
    with pytest.raises(ValueError, match="the step scheduler needs decay_every"):
        OptimSettings("adam", "step", decay_rate=0.5)
    with pytest.raises(ValueError, match="decay_rate is read only by the step scheduler, not by 'none'"):
        OptimSettings("adam", decay_rate=0.5)
    with pytest.raises(ValueError, match=r"decay_rate must lie in \(0, 1\]"):
        OptimSettings("adam", "step", decay_rate=1.5, decay_every=2)
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        OptimSettings("sgd")
    assert resolve_config({"optim": {"scheduler": "step", "decay_rate": 1, "decay_every": 10}})["optim"]["decay_rate"] == 1.0


def test_ban_warmup_factor_by_hand_over_twenty_epochs():
    # ban-vqa's train.py: 0.5, 1, 1.5, 2 x lr in epochs 0-3, then x 0.25 at epochs 10, 12, 14, 16, 18
    expected = [0.5, 1.0, 1.5, 2.0] + [2.0] * 6 + [0.5] * 2 + [0.125] * 2 + [0.03125] * 2 + [0.0078125] * 2
    expected += [0.001953125] * 3
    assert [ban_warmup_factor(epoch) for epoch in range(21)] == pytest.approx(expected, rel=1e-12)


def test_cosine_schedule_and_the_defaults_by_hand():
    weight = torch.nn.Parameter(torch.zeros(1))
    configured = build_optimizer([{"params": [weight]}], OptimSettings("adamw", "cosine", max_epochs=4), lr=0.1)
    assert configured["lr_scheduler"]["interval"] == "epoch"
    # cosine annealing: lr_e = 0.1 (1 + cos(pi e / 4)) / 2
    assert [_lr_after(1, configured) for _ in range(4)] == pytest.approx(
        [0.1 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(1, 5)], abs=1e-12)
    plain = build_optimizer([{"params": [weight]}], lr=0.1)  # groups without their own decay: none
    assert type(plain) is torch.optim.AdamW and plain.param_groups[0]["weight_decay"] == 0.0
    assert OptimSettings.from_config({}) == OptimSettings("adamw", "none")  # a partial configuration
    assert OptimSettings("adam", "step", decay_rate=1.0, decay_every=1).decay_rate == 1.0  # the bounds are allowed
    with pytest.raises(ValueError, match=r"decay_rate must lie in \(0, 1\]"):
        OptimSettings("adam", "step", decay_rate=0.0, decay_every=1)
    with pytest.raises(ValueError, match="decay_every must be an integer >= 1"):
        OptimSettings("adam", "step", decay_rate=0.5, decay_every=0)
    with pytest.raises(ValueError, match="the step scheduler needs decay_rate"):
        OptimSettings("adam", "step", decay_every=3)


# ---- every task type -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize(("optimizer", "scheduler", "kind", "interval"), [
    ("adam", "step", torch.optim.Adam, "step"), ("adamax", "cosine", torch.optim.Adamax, "epoch"),
    ("adamw", "none", torch.optim.AdamW, None),
])
def test_every_task_type_builds_the_configured_optimizer(name, optimizer, scheduler, kind, interval, tmp_path):
    config = TINY[name](tmp_path)
    step = {"decay_rate": 0.5, "decay_every": 2} if scheduler == "step" else {}
    config["optim"] = {**config.get("optim", {}), "optimizer": optimizer, "scheduler": scheduler, **step}
    resolved = resolve_config(config)
    spec = task_spec(name)
    module = spec.build_module(resolved, spec.build_data(resolved))
    configured = module.configure_optimizers()
    built = configured if interval is None else configured["optimizer"]
    assert type(built) is kind
    base = [group["lr"] for group in built.param_groups]
    assert base and all(group["params"] for group in built.param_groups[:1])
    if interval is None:
        return
    assert configured["lr_scheduler"]["interval"] == interval
    if scheduler == "step":  # 5 steps: 5 // 2 = 2 decays of every group's rate
        assert [g["lr"] for g in built.param_groups] == base
        assert _lr_after(5, configured) == pytest.approx(base[0] * 0.25)
        assert [g["lr"] for g in built.param_groups] == pytest.approx([b * 0.25 for b in base])


# ---- the step schedule in a run, and resumed ---------------------------------------------------------
class StepRates(Callback):
    """The learning rate of each training step, by global step."""

    def __init__(self):
        self.lrs = {}

    def on_train_batch_start(self, trainer, module, batch, batch_index):
        self.lrs[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


def test_step_decay_in_a_run_and_after_resuming(tiny_config, tmp_path):
    config = tiny_config(optim={"optimizer": "adam", "scheduler": "step", "decay_rate": 0.5, "decay_every": 4},
                         trainer={"max_epochs": 3, "patience": 0})
    seen = StepRates()
    whole = train(config, run_dir=tmp_path / "whole", callbacks=[seen])
    assert len(seen.lrs) > 8
    assert seen.lrs == pytest.approx({k: 0.01 * 0.5 ** (k // 4) for k in seen.lrs})  # per optimiser step
    with pytest.raises(RuntimeError, match="interrupted"):
        train(config, run_dir=tmp_path / "cut", callbacks=[Interrupt(1)])
    again = StepRates()
    resumed = train({}, resume=tmp_path / "cut", callbacks=[again])
    assert min(again.lrs) > 0 and again.lrs == {k: seen.lrs[k] for k in again.lrs}  # the schedule went on
    last = [read_checkpoint(r / "checkpoints" / "last.safetensors") for r in (whole.run_dir, resumed.run_dir)]
    assert last[0]["lr_schedulers"] == last[1]["lr_schedulers"]
    assert (last[0]["lr_schedulers"][0]["step_size"], last[0]["lr_schedulers"][0]["gamma"]) == (4, 0.5)
    assert all(torch.equal(last[0]["state_dict"][k], last[1]["state_dict"][k]) for k in last[0]["state_dict"])
    assert resumed.test == whole.test
