"""Task type ``chimera`` (polyfuse.tasks.chimera.spec) on a tiny BERT saved as a MiniLM folder
(nothing downloads): Table 4's masked training with L_T, whole-split scores against a
pair-by-pair oracle, the held-out L_T. Resume, evaluate and predict: tests/tasks/test_task_contract.py."""

import lightning as L
import pytest
import torch
from pydantic import ValidationError
from tests.tiny.chimera import write_corpus_files, write_tiny_bert

from polyfuse.engine.checkpoints import SafetensorsCheckpointIO
from polyfuse.tasks.chimera.spec import ABLATION_ROWS, ChimeraConfig
from polyfuse.tasks.registry import task_spec


@pytest.fixture(scope="module")
def encoder_folder(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def _config(tmp_path, encoder_folder, **section):
    section = {**write_corpus_files(tmp_path), "encoder_path": str(encoder_folder), "num_topics": 3,
               "hyperbolic_dim": 3, **section}
    return {"seed": 2, "output_dir": str(tmp_path / "runs"), "chimera": ChimeraConfig(**section).model_dump(),
            "data": {"batch_size": 3, "eval_batch_size": 3}, "optim": {"lr": 1e-3, "weight_decay": 1e-4},
            "model": {"options": {}}}


def _trainer(epochs, **options):
    return L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, plugins=[SafetensorsCheckpointIO()], **options)


def test_the_section_refuses_unknown_keys_and_impossible_rows():
    with pytest.raises(ValidationError, match="num_topic"):
        ChimeraConfig(source="x", num_topic=3)
    with pytest.raises(ValidationError, match="tlm needs topic layers"):
        ChimeraConfig(source="x", num_topics=0)
    for switches in ABLATION_ROWS.values():  # every row of Table 4 is a valid section
        ChimeraConfig(source="x", **switches)


def test_masked_training_trains_lt_and_whole_split_scores_match_pair_by_pair(tmp_path, encoder_folder):
    spec = task_spec("chimera")
    config = _config(tmp_path, encoder_folder, scalar_lr=0.1)
    data = spec.build_data(config)
    module = spec.build_module(config, data)
    report = spec.prepare_module(module, config, data, False)
    assert report["lm_head"]["held_out_nll"] <= report["lm_head"]["held_out_nll_initial"]
    assert module.lm_head is not None and not any(k.startswith(("encoder", "lm_head")) for k in module.state_dict())
    trainer = _trainer(2, enable_checkpointing=False)
    trainer.fit(module, datamodule=data.datamodule)
    logged = trainer.callback_metrics
    assert torch.isfinite(logged["train/topic_lm"]) and "train/topic_matching" in logged
    assert abs(float(logged["train/omega_t"]) - 0.5) > 0.02  # the scalars learn at scalar_lr 0.1
    (result,) = trainer.test(module, datamodule=data.datamodule, verbose=False)
    test = data.prepared.splits["test"]
    tokens, mask = data.prepared.tokens["test"]
    video = test.experts["app"]
    module.eval()
    with torch.no_grad():  # every pair scored alone, ranks counted by hand (ties pessimistic)
        text, videos = module.model.texts(tokens, mask), module.model.videos(video.features, video.mask)
        scores = torch.tensor([[float(module.model.pair_scores(text, videos, torch.tensor([[c, v]])))
                                for v in range(len(test.video_ids))] for c in range(len(test.captions))])
    ranks = []
    for c, owner in enumerate(test.caption_video):
        correct = test.video_ids.index(owner)
        ranks.append(1 + sum(1 for v in range(len(test.video_ids)) if v != correct and scores[c, v] >= scores[c, correct]))
    assert result["test/t2v_R@1"] == pytest.approx(100 * sum(r == 1 for r in ranks) / len(ranks), abs=1e-3)
    assert result["test/t2v_MeanR"] == pytest.approx(sum(ranks) / len(ranks), abs=1e-3)
    extra = spec.after_test(module, data, tmp_path)
    assert "test_shuffled_words" in extra and "omega_t" in extra["learned_scalars"]


class _History(L.Callback):
    def __init__(self):
        self.rows = []

    def on_train_epoch_end(self, trainer, module):  # after the epoch's validation
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def test_the_held_out_lt_uses_fixed_masks_and_is_reported_for_a_row_without_lt(tmp_path, encoder_folder):
    """At lr 0 the model never changes: the held-out L_T (fixed masks) is the same every
    epoch while the training L_T follows each epoch's fresh masks; a row that does not
    train L_T reports it too."""
    spec = task_spec("chimera")
    config = _config(tmp_path, encoder_folder, shuffled_test=False)
    config["optim"]["lr"] = 0.0
    data = spec.build_data(config)
    module = spec.build_module(config, data)
    spec.prepare_module(module, config, data, False)
    history = _History()
    _trainer(3, enable_checkpointing=False, callbacks=[history]).fit(module, datamodule=data.datamodule)
    assert len({round(h["val/topic_lm"], 6) for h in history.rows}) == 1
    assert len({round(h["train/topic_lm"], 6) for h in history.rows}) > 1
    without = _config(tmp_path, encoder_folder, shuffled_test=False, topic_lm=False)
    data = spec.build_data(without)
    module = spec.build_module(without, data)
    spec.prepare_module(module, without, data, False)
    trainer = _trainer(1, enable_checkpointing=False)
    trainer.fit(module, datamodule=data.datamodule)
    assert "train/topic_lm" not in trainer.callback_metrics and float(trainer.callback_metrics["val/topic_lm"]) > 0
