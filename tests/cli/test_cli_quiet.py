"""What the commands print besides their results (issue 41): under ``--quiet`` nothing
from the libraries polyfuse drives (Lightning's info lines, transformers' loading bar,
pycocoevalcap's PTB tokenizer report), and every warning as one line,
``polyfuse <command>: warning: ...``, said once per command.

Lightning's lines are log records: they are looked for both in what reaches the file
descriptors (``capfd``) and in the records (``caplog``: under pytest the records may go
to pytest's handler rather than to stderr), with Lightning's loggers at INFO as in a
fresh process.
"""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import yaml
from tests.tiny.captioning import captioning_config_file, write_captioning_data

from polyfuse.cli.main import main, one_line_warnings
from polyfuse.metrics.captioning import java_available

#: what the libraries print that is no result and no warning
NOISE = ("GPU available", "TPU available", "litlogger", "Restoring states", "Loaded model weights",
         "Loading weights", "PTBTokenizer", "Trainer.fit` stopped")


@pytest.fixture
def lightning_talks(caplog):
    """Lightning's loggers at INFO (as a fresh process has them; an earlier test may have
    quieted them), records kept; restored after the test."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        caplog.set_level(logging.INFO, logger=name)
    caplog.set_level(logging.INFO)
    return caplog


def _said(capfd, caplog) -> tuple[str, str]:
    """(stdout, stderr and the log records' messages) since the last call."""
    out, err = capfd.readouterr()
    records = "\n".join(record.getMessage() for record in caplog.records)
    caplog.clear()
    return out, err + "\n" + records


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(word in line for word in NOISE)]


def _captioning_with_a_missing_video(folder):
    """The tiny captioning data, its train split naming one video that has neither captions
    nor features (skipped with a warning); ``trainer.quiet`` left at its default."""
    write_captioning_data(folder)
    splits = json.loads((folder / "splits.json").read_text())
    splits["train"].append("vid99")
    (folder / "splits.json").write_text(json.dumps(splits))
    path = captioning_config_file(folder, missing_features="skip")
    config = yaml.safe_load(path.read_text())
    config["trainer"] = {key: value for key, value in config["trainer"].items() if key not in ("quiet", "progress_bar")}
    path.write_text(yaml.safe_dump(config))
    return path


def test_train_quiet_evaluate_predict_print_results_and_one_line_warnings(tmp_path, capfd, lightning_talks):
    config = _captioning_with_a_missing_video(tmp_path)
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run), "--quiet"]) == 0
    out, err = _said(capfd, lightning_talks)
    assert not _noise(out + err), _noise(out + err)
    assert "best checkpoint: " in out and "test: BLEU-1 " in out
    assert "it/s" not in err  # --quiet hides the progress bar too
    skipped = "captioning: skipped videos without captions or features: 1 of train"
    warned = [line for line in err.splitlines() if skipped in line]
    assert warned == [f"polyfuse train: warning: {skipped}"], err  # once, one line
    assert ".py:" not in err and "Warning:" not in err  # no source line, no category
    checkpoint = str(run / "checkpoints" / "best.safetensors")

    assert main(["evaluate", "--checkpoint", checkpoint]) == 0  # evaluate has no --quiet: it never talks
    out, err = _said(capfd, lightning_talks)
    assert not _noise(out + err), _noise(out + err)
    assert "CIDEr-D" in out
    assert all(line.startswith("polyfuse evaluate: warning: ") for line in err.splitlines() if line.strip())

    assert main(["predict", "--checkpoint", checkpoint, "--split", "test", "--out", str(tmp_path / "p.json")]) == 0
    out, err = _said(capfd, lightning_talks)
    assert not _noise(out + err), _noise(out + err)
    assert all(line.startswith("polyfuse predict: warning: ") for line in err.splitlines() if line.strip())


def test_without_quiet_lightning_says_its_info_but_never_its_advert_or_the_best_checkpoints_loading(
    tmp_path, capfd, lightning_talks, tiny_task
):
    config = tiny_task("classification")
    config["trainer"] = {**config["trainer"], "quiet": False, "max_epochs": 1}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    _, err = _said(capfd, lightning_talks)
    assert "GPU available" in err  # the check above can fail: these lines are seen when said
    assert "litlogger" not in err and "Restoring states" not in err and "Loaded model weights" not in err


def test_the_text_encoder_loads_without_a_progress_bar(tmp_path, capfd, lightning_talks, tiny_task):
    """Chimera reads its (here tiny) MiniLM-format encoder with transformers."""
    config = tiny_task("chimera")
    config["trainer"] = {**config["trainer"], "quiet": False, "max_epochs": 1}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    capfd.readouterr()  # the tiny encoder's writing
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    out, err = _said(capfd, lightning_talks)
    assert not _noise(out + err), _noise(out + err)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "best.safetensors")]) == 0
    out, err = _said(capfd, lightning_talks)
    assert not _noise(out + err), _noise(out + err)
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()  # left as it was


def test_compare_says_a_warning_of_every_run_once(tmp_path, capfd, tiny_task):
    """Labels outside the configured range, clipped: logged by every run of the comparison."""
    config = tiny_task("sentiment")
    config["task"] = {"type": "sentiment", "target_ranges": [[-0.5, 0.5]], "out_of_range": "clip"}
    config["trainer"] = {**config["trainer"], "max_epochs": 1}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["compare", "--config", str(path), "--models", "concat,tfn", "--seeds", "2",
                 "--out", str(tmp_path / "compare"), "--quiet"]) == 0  # fmt: skip
    out, err = capfd.readouterr()
    clipped = [line for line in err.splitlines() if "clipped" in line]
    assert len(clipped) == 1 and clipped[0].startswith("polyfuse compare: warning: "), err
    assert "into its range [-0.5, 0.5]" in clipped[0]
    assert out.count(" seed ") == 4  # the four runs' results


def test_a_warning_is_one_line_said_once_from_any_place(capsys):
    with one_line_warnings("demo"):
        warnings.warn("two\nlines", RuntimeWarning, stacklevel=1)
        warnings.warn("two\nlines", RuntimeWarning, stacklevel=1)  # another line of code, the same message
        logging.getLogger("polyfuse.data.prepare").warning("%s: two\nlines", "logged")
        logging.getLogger("polyfuse.data.prepare").warning("%s: two\nlines", "logged")
        warnings.warn("other", stacklevel=1)
    assert capsys.readouterr().err.splitlines() == [
        "polyfuse demo: warning: two lines", "polyfuse demo: warning: logged: two lines", "polyfuse demo: warning: other",
    ]
    with pytest.warns(RuntimeWarning, match="after"):  # the handler is gone
        warnings.warn("after", RuntimeWarning, stacklevel=1)
    assert "polyfuse demo" not in capsys.readouterr().err


@pytest.mark.skipif(not java_available(), reason="the PTB tokenizer is Java")
def test_the_java_ptb_tokenization_is_pycocoevalcaps_and_says_nothing(capfd):
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from polyfuse.metrics.captioning import _java_ptb_tokenize

    captions = {"a": ["A man, walking.", "the man's dog -- (barking)!"], "b": ["Un café\ncrème", " . "], "c": [""]}
    expected = PTBTokenizer().tokenize({v: [{"caption": c} for c in texts] for v, texts in captions.items()})
    capfd.readouterr()
    assert _java_ptb_tokenize(captions) == expected
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_demo_quiet_prints_the_table_only(capfd):
    assert main(["demo", "--samples", "40", "--epochs", "1", "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert err == ""  # no progress bars
    lines = out.splitlines()
    assert lines[0].startswith("| model") and lines[-1].startswith("Total time:")


def test_only_the_first_process_of_a_data_parallel_run_says_warnings(capsys, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")  # a process Lightning started: it re-runs the command
    with one_line_warnings("train"):
        warnings.warn("skipped videos", RuntimeWarning, stacklevel=1)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    with one_line_warnings("train"):
        warnings.warn("skipped videos", RuntimeWarning, stacklevel=1)
    assert capsys.readouterr().err == "polyfuse train: warning: skipped videos\n"
