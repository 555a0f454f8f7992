"""The bottom-up TSV -> adaptive HDF5 converter, against values the test encodes itself."""

from __future__ import annotations

import base64
import json

import h5py
import numpy as np
import pytest

from polyfuse.cli.main import main
from polyfuse.data.formats import bottom_up_tsv
from polyfuse.data.formats.bottom_up_tsv import (
    default_index_path,
    import_bottom_up,
    read_tsv_line,
)
from polyfuse.data.formats.features import load_bottom_up_features

DIM = 6


def _b64(array) -> str:
    return base64.b64encode(np.asarray(array, dtype="<f4").tobytes()).decode()


def _images(count: int = 9, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    images = []
    for k in range(count):
        n = int(rng.integers(1, 7))
        w, h = int(rng.integers(100, 700)), int(rng.integers(100, 700))
        x1, y1 = rng.uniform(0, w / 2, n), rng.uniform(0, h / 2, n)
        boxes = np.stack([x1, y1, x1 + rng.uniform(1, w / 2, n), y1 + rng.uniform(1, h / 2, n)], 1)
        images.append(
            {
                "id": 391895 + 17 * k,
                "w": w,
                "h": h,
                "boxes": boxes.astype(np.float32),
                "features": rng.standard_normal((n, DIM)).astype(np.float32),
            }
        )
    return images


def _line(image: dict, **replace: str) -> str:
    fields = {
        "image_id": str(image["id"]),
        "image_w": str(image["w"]),
        "image_h": str(image["h"]),
        "num_boxes": str(len(image["boxes"])),
        "boxes": _b64(image["boxes"]),
        "features": _b64(image["features"]),
    }
    fields.update(replace)
    return "\t".join(v for v in fields.values() if v is not None) + "\n"


def _write(path, images, bad: dict[int, dict] | None = None) -> None:
    path.write_text(
        "".join(_line(image, **(bad or {}).get(k, {})) for k, image in enumerate(images))
    )


def test_import_matches_the_values_encoded(tmp_path):
    images = _images()
    tsv = tmp_path / "trainval.tsv"
    _write(tsv, images)
    out = tmp_path / "train.hdf5"
    summary = import_bottom_up(tsv, out, progress=False)
    assert summary.index_path == tmp_path / "train_imgid2idx.json" == default_index_path(out)
    counts = [len(i["boxes"]) for i in images]
    assert (summary.images, summary.boxes, summary.feature_dim) == (len(images), sum(counts), DIM)
    assert (summary.min_boxes, summary.max_boxes) == (min(counts), max(counts))
    index = json.loads(summary.index_path.read_text())
    assert index == {str(image["id"]): row for row, image in enumerate(images)}
    with h5py.File(out, "r") as handle:
        assert handle.attrs["complete"]
        pos = handle["pos_boxes"][:]
        assert pos.dtype == np.int64
        np.testing.assert_array_equal(pos[:, 1] - pos[:, 0], counts)
        assert pos[0, 0] == 0 and (pos[1:, 0] == pos[:-1, 1]).all()
        for row, image in enumerate(images):
            start, end = pos[index[str(image["id"])]]
            np.testing.assert_array_equal(handle["image_features"][start:end], image["features"])
            np.testing.assert_array_equal(handle["image_bb"][start:end], image["boxes"])
            b, w, h = image["boxes"].astype(np.float64), image["w"], image["h"]
            by_hand = np.stack(
                [
                    b[:, 0] / w,
                    b[:, 1] / h,
                    b[:, 2] / w,
                    b[:, 3] / h,
                    (b[:, 2] - b[:, 0]) / w,
                    (b[:, 3] - b[:, 1]) / h,
                ],
                1,
            )
            spatial = handle["spatial_features"][start:end]
            assert spatial.dtype == np.float32 and spatial.shape == (len(b), 6)
            np.testing.assert_allclose(spatial, by_hand, rtol=1e-6, atol=1e-7)
            assert row == index[str(image["id"])]
    loaded = load_bottom_up_features(out, summary.index_path)
    first = images[3]
    row = loaded.rows[first["id"]]
    n = len(first["boxes"])
    np.testing.assert_array_equal(loaded.features[row, :n].numpy(), first["features"])
    assert (loaded.features[row, n:] == 0).all()


def test_read_tsv_line_decodes_str_and_bytes(tmp_path):
    image = _images(1)[0]
    for line in (_line(image), _line(image).encode(), _line(image).replace("\n", "\r\n")):
        image_id, w, h, boxes, features = read_tsv_line(line, "x.tsv", 1)
        assert (image_id, w, h) == (image["id"], image["w"], image["h"])
        np.testing.assert_array_equal(boxes, image["boxes"])
        np.testing.assert_array_equal(features, image["features"])
    with pytest.raises(ValueError, match=r"x.tsv line 4 \(image id 391895\): features are 6-d"):
        read_tsv_line(_line(image), "x.tsv", 4, feature_dim=8)


NAN = _b64(np.full((2, DIM), np.nan))


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        ({"features": "abc!@#"}, "features is not valid base64"),
        ({"boxes": _b64(np.zeros(3))}, "boxes hold 3 floats, expected num_boxes x 4"),
        (
            {"num_boxes": "2", "boxes": _b64(np.zeros((2, 4))), "features": NAN},
            "features hold NaN or Inf",
        ),
        ({"features": None}, "5 tab-separated field"),
        ({"num_boxes": "two"}, "num_boxes 'two' is not an integer"),
        ({"num_boxes": "0"}, "num_boxes is 0, expected at least 1"),
        ({"image_w": "0"}, "image_w is 0"),
        ({"features": _b64(np.zeros(7))}, "not a multiple of num_boxes"),
    ],
)
def test_a_bad_line_is_refused_naming_its_line_and_image(tmp_path, replace, message):
    images = _images(5)
    tsv = tmp_path / "f.tsv"
    _write(tsv, images, {3: replace})
    with pytest.raises(ValueError) as caught:
        import_bottom_up(tsv, tmp_path / "f.hdf5", progress=False)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"{tsv} line 4 (image id {images[3]['id']}): "), text
    assert message in text
    assert not default_index_path(tmp_path / "f.hdf5").exists()


def test_a_line_of_another_feature_size_and_a_duplicate_id_are_refused(tmp_path):
    images = _images(5)
    tsv = tmp_path / "f.tsv"
    _write(tsv, images, {2: {"features": _b64(np.zeros((len(images[2]["boxes"]), DIM + 1)))}})
    with pytest.raises(
        ValueError, match=rf"line 3 \(image id {images[2]['id']}\): features are 7-d"
    ):
        import_bottom_up(tsv, tmp_path / "a.hdf5", progress=False)
    _write(tsv, images, {4: {"image_id": str(images[1]["id"])}})
    with pytest.raises(
        ValueError, match=rf"line 5 \(image id {images[1]['id']}\): .*already on line 2"
    ):
        import_bottom_up(tsv, tmp_path / "b.hdf5", progress=False)


def test_an_interrupted_import_resumes_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setattr(bottom_up_tsv, "FLUSH_LINES", 4)  # several flushes before the bad line
    images = _images(40, seed=3)
    clean = tmp_path / "clean.tsv"
    _write(clean, images)
    one_shot = import_bottom_up(clean, tmp_path / "one.hdf5", progress=False)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    tsv = resumed_dir / "clean.tsv"  # the same name: the same input, first with a bad line 23
    _write(tsv, images, {22: {"boxes": "###"}})
    out = resumed_dir / "one.hdf5"
    with pytest.raises(ValueError, match=rf"line 23 \(image id {images[22]['id']}\)"):
        import_bottom_up(tsv, out, progress=False)
    with h5py.File(out, "r") as handle:  # the lines before stay
        assert handle.attrs["lines_done"] == 22 and not handle.attrs["complete"]
        assert len(handle["pos_boxes"]) == 22
    _write(tsv, images)  # fixed
    summary = import_bottom_up(tsv, out, progress=False)
    assert summary.resumed_at_line == 22
    with h5py.File(tmp_path / "one.hdf5", "r") as a, h5py.File(out, "r") as b:
        assert sorted(a) == sorted(b)
        for name in a:
            np.testing.assert_array_equal(a[name][:], b[name][:], err_msg=name)
            assert a[name].dtype == b[name].dtype
    assert summary.index_path.read_text() == one_shot.index_path.read_text()
    assert (summary.images, summary.boxes) == (one_shot.images, one_shot.boxes)


def test_rows_written_after_the_last_flush_are_dropped_on_resume(tmp_path):
    images = _images(12)
    tsv = tmp_path / "a.tsv"
    _write(tsv, images)
    import_bottom_up(tsv, tmp_path / "ref.hdf5", progress=False)
    out = tmp_path / "x.hdf5"
    import_bottom_up(tsv, out, progress=False)
    with h5py.File(out, "a") as handle:  # as if killed: progress at line 5, stray rows after it
        pos = handle["pos_boxes"][:]
        handle["image_features"][pos[5, 0] :] = 99.0
        with tsv.open("rb") as source:
            lines = source.readlines()
        handle.attrs.update(
            {
                "complete": False,
                "lines_done": 5,
                "bytes_done": sum(len(x) for x in lines[:5]),
                "images_done": 5,
                "boxes_done": int(pos[5, 0]),
                "last_line_start": sum(len(x) for x in lines[:4]),
            }
        )
        import hashlib

        handle.attrs["last_line_sha256"] = hashlib.sha256(lines[4]).hexdigest()
    import_bottom_up(tsv, out, progress=False)
    with h5py.File(tmp_path / "ref.hdf5", "r") as a, h5py.File(out, "r") as b:
        for name in a:
            np.testing.assert_array_equal(a[name][:], b[name][:], err_msg=name)


def test_a_finished_or_foreign_output(tmp_path, capsys):
    images = _images(4)
    tsv, other = tmp_path / "a.tsv", tmp_path / "b.tsv"
    _write(tsv, images)
    _write(other, images[:2])
    out = tmp_path / "a.hdf5"
    import_bottom_up(tsv, out, progress=False)
    before = out.stat().st_mtime_ns
    again = import_bottom_up(tsv, out, progress=False)
    assert again.already_complete and again.images == 4 and out.stat().st_mtime_ns == before
    assert "left alone" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"holds the import of a\.tsv, not of b\.tsv"):
        import_bottom_up(other, out, progress=False)
    assert import_bottom_up(other, out, progress=False, overwrite=True).images == 2
    foreign = tmp_path / "foreign.hdf5"
    with h5py.File(foreign, "w") as handle:
        handle["features"] = np.zeros((1, 2))
    with pytest.raises(ValueError, match="not written by polyfuse's bottom-up import"):
        import_bottom_up(tsv, foreign, progress=False)
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no image"):
        import_bottom_up(empty, tmp_path / "e.hdf5", progress=False)


def test_cli_import_bottom_up(tmp_path, capsys):
    images = _images(3)
    tsv = tmp_path / "val.tsv"
    _write(tsv, images)
    index = tmp_path / "ids.json"
    code = main(
        [
            "vqa",
            "import-bottom-up",
            str(tsv),
            "--out",
            str(tmp_path / "val.hdf5"),
            "--index",
            str(index),
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "3 images" in printed and str(index) in printed
    assert json.loads(index.read_text()) == {str(i["id"]): row for row, i in enumerate(images)}
    _write(tsv, images, {1: {"boxes": "%%"}})
    assert (
        main(
            [
                "vqa",
                "import-bottom-up",
                str(tsv),
                "--out",
                str(tmp_path / "bad.hdf5"),
                "--no-progress",
            ]
        )
        == 2
    )
    assert f"line 2 (image id {images[1]['id']})" in capsys.readouterr().err
