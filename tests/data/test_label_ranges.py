"""Label ranges on the npz path: configured ranges are checked (refused naming the file and
row, or clipped on request, said in the log), and they fix MA-k's class count."""

import numpy as np
import pytest
import yaml

from polyfuse.cli.main import EXIT_INPUT, main
from polyfuse.data import load_source, prepare_data


def write_npz(path, labels, *, rows=30, seed=0):
    rng = np.random.default_rng(seed)
    split = np.array(["train"] * 20 + ["val"] * 5 + ["test"] * 5)
    np.savez(path, a=rng.normal(size=(rows, 3, 2)).astype(np.float32), b=rng.normal(size=(rows, 4)).astype(np.float32),
             label=labels, split=split)
    return path


DATA = {"modalities": ["a", "b"], "split": "split"}


def test_npz_trait_labels_outside_their_range_are_refused_with_their_row(tmp_path):
    labels = np.tile(np.array([[2.0, 3.0]], dtype=np.float32), (30, 1))
    labels[::2, 0] = 4.0
    labels[17, 1] = 5.5
    path = write_npz(tmp_path / "f.npz", labels)
    table = load_source(str(path))
    task = {"type": "traits", "target_names": ["x", "y"], "target_ranges": {"y": [1, 5]}}
    with pytest.raises(ValueError, match=rf"^{path} row 17: label y = 5\.5 lies outside its range \[1, 5\] "
                                         r"\(task.target_ranges\)"):
        prepare_data(table, DATA, task, label_kind="scores")
    prepared = prepare_data(table, DATA, {**task, "out_of_range": "clip"}, label_kind="scores")
    assert prepared.targets[17, 1] == 5.0 and prepared.label_info["ranges"][1] == [1.0, 5.0]
    assert prepared.label_info["checked"] == [False, True]  # x: from the training labels, not checked


def test_npz_sentiment_range_is_checked_and_recorded(tmp_path):
    labels = np.linspace(-2.5, 2.5, 30).astype(np.float32)
    labels[26] = -3.25
    path = write_npz(tmp_path / "s.npz", labels)
    table = load_source(str(path))
    prepared = prepare_data(table, DATA, {"type": "sentiment"}, label_kind="score")  # no range: nothing to check
    assert prepared.label_info == {}
    with pytest.raises(ValueError, match=rf"^{path} row 26: label label = -3\.25 lies outside its range \[-3, 3\]"):
        prepare_data(table, DATA, {"type": "sentiment", "target_ranges": [[-3, 3]]}, label_kind="score")
    with pytest.raises(ValueError, match="a sentiment task takes one"):
        prepare_data(table, DATA, {"type": "sentiment", "target_ranges": [[-3, 3], [0, 1]]}, label_kind="score")


def test_cli_refuses_an_out_of_range_label_in_one_line(tmp_path, capsys):
    labels = np.full((30, 1), 4.0, dtype=np.float32)
    labels[3, 0] = 9.0
    path = write_npz(tmp_path / "t.npz", labels)
    config = {
        "output_dir": str(tmp_path / "runs"),
        "task": {"type": "traits", "target_names": ["trusting"], "target_ranges": [[1, 5]]},
        "data": {"source": str(path), **DATA, "batch_size": 8},
        "model": {"fusion": "concat", "fusion_dim": 4, "out_dim": 4, "encoder": {"hidden_dim": 4}},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "num_threads": 1, "patience": 0},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--no-progress", "--quiet"]) == EXIT_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{path} row 3: label trusting = 9 lies outside its range [1, 5]" in lines[0]
    for bad, message in (([[5, 1]], "finite low < high"), ({"trusted": [1, 5]}, "names 'trusted', not one of")):
        config["task"]["target_ranges"] = bad
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
        assert main(["train", "--config", str(tmp_path / "c.yaml"), "--no-progress", "--quiet"]) == EXIT_INPUT
        assert message in capsys.readouterr().err
