"""Fixtures of the command-line tests: a tiny synthetic configuration file, a VQA run
trained on extracted picture features."""

from types import SimpleNamespace

import pytest
import yaml
from tests.helpers.runs import csv_rows
from tests.tiny.synthetic import CLI_CONFIG
from tests.tiny.vqa import vqa_config
from tests.tiny.vqa_images import PooledColours, picture, write_question_files


@pytest.fixture
def config_file(tmp_path):
    """``tiny.yaml``: :data:`tests.tiny.synthetic.CLI_CONFIG` writing under ``tmp_path / "runs"``."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**CLI_CONFIG, "output_dir": str(tmp_path / "runs")}))
    return path


@pytest.fixture(scope="module")
def trained_vqa(tmp_path_factory):
    """A BAN run trained 3 epochs on features that ``extract images`` wrote at 64 px (2 x 2
    cells, :class:`~tests.tiny.vqa_images.PooledColours`), reduced to 4 principal
    components: ``folder`` (the pictures, question files and features), ``best`` (its best
    checkpoint), ``test`` (its predictions on the test split, as CSV rows)."""
    import polyfuse.extract.images as extraction
    from polyfuse.cli.main import main

    folder = tmp_path_factory.mktemp("vqa_use")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(extraction, "load_backbone", PooledColours)
        for split, ids in (("train", range(16)), ("test", range(16, 20))):
            (folder / f"{split}_images").mkdir()
            for image_id in ids:
                picture(folder / f"{split}_images" / f"{image_id}.png", image_id)
            write_question_files(folder, split, ids)
            command = ["extract", "images", str(folder / f"{split}_images"), "--out", str(folder / f"{split}.h5"),
                       "--image-size", "64", "--no-progress"]  # fmt: skip
            assert main(command) == 0
    config = vqa_config(folder)
    config["data"]["vqa"]["feature_dim"] = 4
    (folder / "vqa.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(folder / "vqa.yaml"), "--max-epochs", "3", "--out", str(folder / "run")]) == 0
    best = folder / "run" / "checkpoints" / "best.safetensors"
    assert main(["predict", "--checkpoint", str(best), "--split", "test", "--out", str(folder / "test.csv")]) == 0
    return SimpleNamespace(folder=folder, best=best, test=csv_rows(folder / "test.csv"))
