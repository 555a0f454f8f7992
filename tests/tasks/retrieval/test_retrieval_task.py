"""Task type ``retrieval`` (polyfuse.tasks.retrieval.spec): its config section, its batches,
its whole-split ranking against a brute-force oracle, and resume equal to an uninterrupted run."""

import lightning as L
import pytest
import torch
from pydantic import ValidationError

from polyfuse.engine.checkpoints import SafetensorsCheckpointIO, SafetensorsModelCheckpoint
from polyfuse.engine.seeding import ReseedEachEpoch
from polyfuse.tasks.ranking.data import DistinctVideoBatches
from polyfuse.tasks.registry import task_spec
from polyfuse.tasks.retrieval.spec import RetrievalConfig


def _config(tmp_path, fusion="man", **section):
    section = {"source": "synthetic:videos=100,steps=4", "text": "bow", "embed_dim": 8,
               "hidden_dim": 8, **section}
    return {"seed": 3, "output_dir": str(tmp_path / "runs"), "retrieval": RetrievalConfig(**section).model_dump(),
            "data": {"batch_size": 16, "eval_batch_size": 7}, "optim": {"lr": 1e-2, "weight_decay": 1e-4},
            "model": {"fusion": fusion, "options": {}}}


def _trainer(tmp_path, epochs, **options):
    return L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, plugins=[SafetensorsCheckpointIO()], **options)


def test_the_section_refuses_unknown_keys_and_inconsistent_settings():
    with pytest.raises(ValidationError, match="embed_dims"):
        RetrievalConfig(source="x", embed_dims=3)
    with pytest.raises(ValidationError, match="either source"):
        RetrievalConfig()
    with pytest.raises(ValidationError, match="fusion"):  # the fusion is model.fusion, not the section's
        RetrievalConfig(source="x", fusion="man")


@pytest.mark.parametrize(("model", "section", "message"), [
    ({"fusion": "man"}, {"man_lr": 1e-4}, "retrieval.man_lr applies to MAN as a branch"),
    ({"fusion": "gating"}, {"man_zero_init": True}, r"man_zero_init applies to model.fusion mean\+man only"),
    ({"fusion": "tfn"}, {}, r"model.fusion: task.type retrieval takes man \| concat \| mean \| gating"),
    ({"fusion": "mean+mann"}, {}, r"did you mean 'mean\+man'"),
])
def test_model_fusion_takes_the_video_fusions_and_their_rules(model, section, message):
    from polyfuse.engine.config import resolve_config

    config = {"task": {"type": "retrieval"}, "retrieval": {"source": "synthetic:videos=20", **section}, "model": model}
    with pytest.raises(ValueError, match=message):
        resolve_config(config)
    resolve_config({**config, "model": {"fusion": "gating+man"}, "retrieval": {"source": "x", "man_lr": 1e-4}})


@pytest.mark.parametrize("task", ["retrieval", "chimera"])
def test_an_unknown_training_precision_is_refused(task):
    from polyfuse.engine.config import resolve_config

    config = {"task": {"type": task}, task: {"source": "synthetic:videos=20"}, "trainer": {"precision": "16-mixed"}}
    with pytest.raises(ValueError, match=f"trainer.precision: task.type {task} trains in 32-true or bf16-mixed, "
                                         "not '16-mixed'"):
        resolve_config(config)
    resolve_config({**config, "trainer": {"precision": "bf16-mixed"}})


def test_batches_are_distinct_videos_with_one_of_their_captions_and_follow_the_epoch():
    captions_of = [[0, 1], [2], [3, 4, 5], [6], [7, 8], [9]]
    sampler = DistinctVideoBatches(captions_of, batch_size=4, seed=1)
    first = list(sampler)
    assert [len(b) for b in first] == [4, 2]  # 6 videos: one batch of 4, one of 2
    videos = [v for batch in first for v, _ in batch]
    assert sorted(videos) == list(range(6))
    assert all(c in captions_of[v] for batch in first for v, c in batch)
    assert list(sampler) == first  # the same epoch draws the same batches
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert len(DistinctVideoBatches([[0]] * 5, batch_size=4, seed=0)) == 1  # a last single video is dropped
    assert sum(1 for _ in DistinctVideoBatches([[0]] * 5, batch_size=4, seed=0)) == 1


def _brute_force_t2v(texts, videos, caption_videos, video_ids):
    """Text-to-video ranks from the score matrix, ties pessimistic, in float64."""
    scores = texts.double() @ videos.double().T
    ranks = []
    for i, video in enumerate(caption_videos):
        correct = video_ids.index(video)
        ranks.append(1 + sum(1 for j in range(len(video_ids)) if j != correct and scores[i, j] >= scores[i, correct]))
    return torch.tensor(ranks, dtype=torch.float64)


def test_one_epoch_logs_whole_split_metrics_that_a_brute_force_ranking_gives(tmp_path):
    spec = task_spec("retrieval")
    config = _config(tmp_path)
    data = spec.build_data(config)
    module = spec.build_module(config, data)
    trainer = _trainer(tmp_path, 1, enable_checkpointing=False)
    trainer.fit(module, datamodule=data.datamodule)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    (result,) = trainer.test(module, datamodule=data.datamodule, verbose=False)
    test = data.prepared.splits["test"]
    module.eval()
    with torch.no_grad():
        texts = module.model.embed_texts(data.prepared.vectors["test"])
        experts = list(test.experts.values())
        videos = module.model.embed_videos([e.features for e in experts], [e.mask for e in experts],
                                           torch.stack([e.present for e in experts], dim=1))
    ranks = _brute_force_t2v(texts, videos, test.caption_video, test.video_ids)
    for k in (1, 5, 10):
        assert result[f"test/t2v_R@{k}"] == pytest.approx(100 * float((ranks <= k).double().mean()), abs=1e-4)
    assert result["test/t2v_MeanR"] == pytest.approx(float(ranks.mean()), abs=1e-4)
    recalls = [result[f"test/{d}_R@{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10)]
    assert result["test/rsum"] == pytest.approx(sum(recalls), abs=1e-3)
    extra = spec.after_test(module, data, tmp_path)
    assert set(extra) == {"test_shuffled_words", "references"}
    # bag of words: shuffling a caption's words changes nothing
    assert extra["test_shuffled_words"]["t2v_R@1"] == pytest.approx(result["test/t2v_R@1"], abs=1e-4)


def test_resume_from_the_last_checkpoint_equals_the_uninterrupted_run(tmp_path):
    spec = task_spec("retrieval")
    config = _config(tmp_path, fusion="mean+man", man_lr=1e-3)

    def run(epochs, folder, resume=None):
        L.seed_everything(config["seed"])
        data = spec.build_data(config)
        module = spec.build_module(config, data)
        last = SafetensorsModelCheckpoint(dirpath=str(folder), filename="last", monitor=None, save_top_k=1,
                                          enable_version_counter=False)
        trainer = _trainer(tmp_path, epochs, callbacks=[ReseedEachEpoch(config["seed"]), last])
        trainer.fit(module, datamodule=data.datamodule, ckpt_path=resume)
        return module, trainer

    whole, whole_trainer = run(3, tmp_path / "whole")
    run(2, tmp_path / "cut")
    resumed, resumed_trainer = run(3, tmp_path / "cut2", resume=str(tmp_path / "cut" / "last.safetensors"))
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)
    assert float(resumed_trainer.callback_metrics["val/rsum"]) == float(whole_trainer.callback_metrics["val/rsum"])


def test_a_checkpoint_loads_into_a_module_that_gives_the_runs_test_numbers(tmp_path):
    spec = task_spec("retrieval")
    config = _config(tmp_path, fusion="gating+man")
    data = spec.build_data(config)
    module = spec.build_module(config, data)
    trainer = _trainer(tmp_path, 1, enable_checkpointing=False)
    trainer.fit(module, datamodule=data.datamodule)
    (result,) = trainer.test(module, datamodule=data.datamodule, verbose=False)
    extras = spec.checkpoint_extras(config, data)
    loaded = spec.load_module(module.state_dict(), extras, None)
    test_data = spec.checkpoint_data(extras, split="test")
    again = loaded.evaluate(spec.loader(test_data, "test"))
    for key in ("t2v_R@1", "t2v_R@5", "v2t_R@10", "t2v_MeanR", "rsum"):
        assert again[key] == pytest.approx(result[f"test/{key}"], abs=1e-4)
    outputs = {part: L.Trainer(logger=False, enable_progress_bar=False).predict(loaded, loader)
               for part, loader in spec.loaders(test_data, "test").items()}
    records = spec.records(loaded, outputs, test_data, extras)
    assert len(records) == len(test_data.prepared.splits["test"].captions)
    r1 = 100 * sum(r["rank"] == 1 for r in records) / len(records)
    assert r1 == pytest.approx(result["test/t2v_R@1"], abs=1e-4)
    spec.write_records(records, tmp_path / "p.csv")
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == "caption,video_id,rank,top5"
    with pytest.raises(ValueError, match="--data and --modalities do not apply"):
        spec.checkpoint_data(extras, split="test", source="elsewhere")


class _Losses(L.Callback):
    def __init__(self):
        self.values = []

    def on_train_epoch_end(self, trainer, module):
        self.values.append(float(trainer.callback_metrics["train/loss"]))


def test_bf16_mixed_training_follows_float32(tmp_path):
    """``trainer.precision: bf16-mixed``: the training steps run under bfloat16 autocast (their
    losses differ from float32's by rounding, under 0.5% asserted) and the model trains;
    the ranking runs in float32 either way."""
    spec = task_spec("retrieval")
    losses = {}
    for precision in ("32-true", "bf16-mixed"):
        config = _config(tmp_path, source="synthetic:videos=60,steps=2,events=2,dim=4")
        L.seed_everything(config["seed"])
        data = spec.build_data(config)
        module = spec.build_module(config, data)
        record = _Losses()
        _trainer(tmp_path, 4, enable_checkpointing=False, precision=precision,
                 callbacks=[ReseedEachEpoch(config["seed"]), record]).fit(module, datamodule=data.datamodule)
        losses[precision] = torch.tensor(record.values)
    mixed, single = losses["bf16-mixed"], losses["32-true"]
    assert torch.isfinite(mixed).all() and mixed[-1] < mixed[0]
    assert not torch.equal(mixed, single)
    torch.testing.assert_close(mixed, single, rtol=0.005, atol=0)


class _FirstBatches(L.Callback):
    def __init__(self):
        self.videos = []

    def on_train_batch_start(self, trainer, module, batch, batch_index):
        if batch_index == 0:
            self.videos.append(batch["features"][0].sum().item())


def test_a_trainer_draws_other_batches_each_epoch_and_the_same_ones_again_for_a_seed(tmp_path):
    """Lightning sets the sampler's epoch (on ``batch_sampler.sampler``): each epoch its own
    order, the same orders again for the same seed."""
    spec = task_spec("retrieval")
    config = _config(tmp_path)
    firsts = []
    for _ in range(2):
        data = spec.build_data(config)
        record = _FirstBatches()
        _trainer(tmp_path, 3, enable_checkpointing=False, limit_val_batches=0, callbacks=[record]).fit(
            spec.build_module(config, data), datamodule=data.datamodule)
        firsts.append(record.videos)
    assert len(set(firsts[0])) == 3 and firsts[0] == firsts[1]
