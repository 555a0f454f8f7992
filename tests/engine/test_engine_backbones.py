"""model.backbone in the configuration: the backbones are built with their extra
module, and wrong settings are refused with messages that say what to write."""

import pytest
import torch

from polyfuse.engine.config import load_config, resolve_config
from polyfuse.nn.backbones import LSTMLMF, MulT
from polyfuse.tasks.registry import task_spec


def build_task(config, input_dims, names, label_info):
    """The task module of config's task type around a new backbone."""
    return task_spec(config["task"]["type"]).module_for(config, input_dims, names, label_info)

CONFIGS = "configs/mosi/backbones"


def config(**model):
    return resolve_config({"model": {"backbone": "mult", "fusion": "none", **model}})


def test_mult_with_man_as_extra_module_from_the_repository_configs():
    base = load_config(f"{CONFIGS}/base.yaml")
    entry = load_config(f"{CONFIGS}/mult_man_wo_cao.yaml")
    resolved = resolve_config({**base, "model": {**base["model"], **entry["model"]}})
    task = build_task(resolved, [100, 73, 100], ["text", "audio", "video"], {})
    assert isinstance(task.backbone, MulT)
    assert task.backbone.extra.mode == "hadamard" and task.backbone.extra.input_dims == [30, 30, 30]
    assert task.backbone.out_dim == 3 * 2 * 30 + 32 and task.head.in_features == task.backbone.out_dim


def test_backbone_alone_and_lstm_lmf():
    task = build_task(config(backbone="lstm_lmf", options={"lstm_lmf": {"out": 8}}), [4, 3, 2], ["text", "a", "v"], {})
    assert isinstance(task.backbone, LSTMLMF) and task.backbone.extra is None and task.backbone.out_dim == 8
    batch = {"inputs": [torch.randn(2, 3, d) for d in (4, 3, 2)], "masks": [torch.ones(2, 3, dtype=torch.bool)] * 3}
    assert task(batch).shape == (2, 1)


def test_bad_settings_are_refused_clearly():
    with pytest.raises(ValueError, match=r"model\.fusion: none needs a backbone"):
        resolve_config({"model": {"fusion": "none"}})
    with pytest.raises(ValueError, match=r"model.options.mult: unknown option\(s\) \['depth'\]; MulT takes: dim, heads, layers"):
        build_task(config(options={"mult": {"depth": 2}}), [4, 3, 2], ["t", "a", "v"], {})
    with pytest.raises(ValueError, match=r"unknown backbone 'mlp'.*known: fusion, lstm_lmf, mult"):
        build_task(config(backbone="mlp"), [4, 3, 2], ["t", "a", "v"], {})
    with pytest.raises(ValueError, match="BAN takes at most 2 inputs, but backbone 'mult' gives its extra module one per modality"):
        build_task(config(fusion="ban"), [4, 3, 2], ["t", "a", "v"], {})


def test_lstm_lmf_reads_the_modality_named_text_with_its_lstm_or_refuses():
    """Without text the LSTM (LMF's text subnetwork) ran on audio: now it reads the modality
    named text, or the one model.options.lstm_lmf.text names, or the build is refused."""
    task = build_task(config(backbone="lstm_lmf"), [3, 4, 2], ["audio", "text", "video"], {})
    assert task.backbone.text == 1 and task.backbone.lstm.input_size == 4
    assert sorted(task.backbone.subnetworks) == ["0", "2"]  # audio and video: the pooled subnetworks
    with pytest.raises(ValueError, match=r"none of the modalities \['audio', 'video'\] is named 'text': set "
                                         r"model.options.lstm_lmf.text"):
        build_task(config(backbone="lstm_lmf"), [3, 2], ["audio", "video"], {})
    task = build_task(config(backbone="lstm_lmf", options={"lstm_lmf": {"text": "video"}}), [3, 2], ["audio", "video"], {})
    assert task.backbone.text == 1 and task.backbone.lstm.input_size == 2
    task = build_task(config(backbone="lstm_lmf", options={"lstm_lmf": {"text": 0}}), [3, 2], ["audio", "video"], {})
    assert task.backbone.text == 0 and task.backbone.lstm.input_size == 3
    with pytest.raises(ValueError, match=r"model.options.lstm_lmf.text names 'words', not one of the modalities"):
        build_task(config(backbone="lstm_lmf", options={"lstm_lmf": {"text": "words"}}), [3, 2], ["audio", "video"], {})
