"""What ``polyfuse extract`` shows while it runs and when it ends (issue 41): a progress
bar on stderr only when stderr is a terminal (and not with --no-progress), and a
summary line with the counts, the time and what the file holds."""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("av")
pytest.importorskip("cv2")

import polyfuse.extract.images as extraction
import polyfuse.progress
from polyfuse.cli.main import main

VIDEO = ["--frames", "4", "--flow-size", "64", "--streams", "motion", "--threads", "1"]  # no network: fast


class Terminal(io.StringIO):
    """A stderr that says it is a terminal and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def folder(tmp_path, clips):
    folder = tmp_path / "clips"
    folder.mkdir()
    for name, step in (("moving", 2), ("static", 0)):
        clips.write(folder / f"{name}.mkv", clips.moving_square(8, step=step, seed=1), fps=10, codec="ffv1")
    return folder


@pytest.fixture(autouse=True)
def bar_at_once(monkeypatch):
    """Bars drawn from the start: these extractions take milliseconds."""
    monkeypatch.setattr(polyfuse.progress, "BAR_DELAY", 0.0)


def _summary(out: str) -> str:
    return next(line for line in out.splitlines() if " computed, " in line)


def test_video_summary_line_and_no_bar_off_a_terminal(tmp_path, folder, capsys):
    out = tmp_path / "motion.h5"
    assert main(["extract", "video", str(folder), "--out", str(out), *VIDEO]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # stderr is not a terminal here: no bar, not even with progress on
    line = _summary(captured.out)
    assert re.fullmatch(rf"{re.escape(str(out))}: 2 clips computed, 0 cached, 0 skipped in \d+\.\d s; "
                        r"in the file \(clips x rows x values\): motion 2 x 4 x 132", line), line
    # again: all cached, and the file still holds the two clips' motion
    assert main(["extract", "video", str(folder), "--out", str(out), *VIDEO]) == 0
    assert ": 0 clips computed, 2 cached, 0 skipped in " in _summary(capsys.readouterr().out)


def test_video_bar_on_a_terminal_unless_no_progress(tmp_path, folder, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["extract", "video", str(folder), "--out", str(tmp_path / "a.h5"), *VIDEO]) == 0
    drawn = terminal.getvalue()
    assert "extract: 100%" in drawn and "2/2" in drawn and "clip/s" in drawn, drawn
    terminal.seek(0)
    terminal.truncate()
    assert main(["extract", "video", str(folder), "--out", str(tmp_path / "b.h5"), *VIDEO, "--no-progress"]) == 0
    assert terminal.getvalue() == ""
    assert "2 clips computed" in capsys.readouterr().out


class PooledColours(extraction.torch.nn.Module):
    """A stand-in for EfficientNet-Lite0's interface: (B, 3, S, S) -> (B, 1280, S/32, S/32)."""

    def extract_features(self, batch):
        pooled = extraction.torch.nn.functional.avg_pool2d(batch, 32)  # (B, 3, S/32, S/32)
        return pooled.repeat(1, 1280 // 3 + 1, 1, 1)[:, :1280]


def test_images_summary_line_and_bar(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(extraction, "load_backbone", PooledColours)
    images = tmp_path / "images"
    images.mkdir()
    for image_id in (1, 2, 3):
        Image.fromarray(np.full((64, 64, 3), 40 * image_id, dtype=np.uint8)).save(images / f"{image_id}.png")
    out = tmp_path / "features.h5"
    command = ["extract", "images", str(images), "--out", str(out), "--image-size", "64"]
    assert main(command) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert re.fullmatch(rf"{re.escape(str(out))}: 3 images computed, 0 cached, 0 skipped in \d+\.\d s; "
                        r"in the file \(images x cells x values\): 3 x 4 x 1280", _summary(captured.out))
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(command) == 0
    assert "extract: 100%" in terminal.getvalue() and "3/3" in terminal.getvalue()
    assert ": 0 images computed, 3 cached, 0 skipped in " in _summary(capsys.readouterr().out)
