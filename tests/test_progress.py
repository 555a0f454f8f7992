"""Long steps say what they do (issue 41): a progress bar on stderr only when it is a
terminal and the run allows it, and a final line with counts and time unless quiet:
encoding captions (retrieval, chimera) and pre-training chimera's masked-LM head."""

from __future__ import annotations

import io
import re
import sys

import pytest
from tests.tiny.tasks import TINY

import polyfuse.progress
from polyfuse.engine.config import resolve_config
from polyfuse.progress import progress_bar, run_display
from polyfuse.tasks.registry import task_spec


class Terminal(io.StringIO):
    """A stderr that says it is a terminal and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


def _terminal(monkeypatch) -> Terminal:
    """stderr a terminal, and bars drawn from the start (steps here take milliseconds);
    called in the test (pytest's capture resets sys.stderr after the fixtures)."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(polyfuse.progress, "BAR_DELAY", 0.0)
    return terminal


def _clear(terminal: Terminal) -> None:
    terminal.seek(0)
    terminal.truncate()


def test_a_bar_is_drawn_only_on_a_terminal_and_counts_either_way(monkeypatch, capsys):
    monkeypatch.setattr(polyfuse.progress, "BAR_DELAY", 0.0)
    with progress_bar(total=5, desc="work") as bar:
        bar.update(2)
        bar.update(3)
    assert bar.n == 5 and capsys.readouterr().err == ""  # not a terminal: nothing written
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_bar(total=5, desc="work") as bar:
        bar.update(5)
    assert "work: 100%" in terminal.getvalue() and "5/5" in terminal.getvalue()
    _clear(terminal)
    with progress_bar(total=5, desc="work", show=False) as bar:  # --no-progress, --quiet
        bar.update(5)
    assert terminal.getvalue() == "" and bar.n == 5
    monkeypatch.setattr(polyfuse.progress, "BAR_DELAY", 60.0)  # a step shorter than the delay: no bar
    with progress_bar(total=5, desc="work") as bar:
        bar.update(5)
    assert terminal.getvalue() == ""


@pytest.mark.parametrize(("trainer", "shown"), [
    ({}, (True, True)),
    ({"progress_bar": False}, (False, True)),  # --no-progress: the final line stays
    ({"progress_bar": False, "quiet": True}, (False, False)),  # --quiet
    ({"progress_bar": True, "quiet": True}, (False, False)),  # trainer.quiet alone
])
def test_run_display_follows_the_trainer_settings(trainer, shown):
    assert run_display({"trainer": trainer}) == shown


def _config(name, folder, **trainer):
    config = TINY[name](folder)
    config["trainer"].update(trainer)
    return resolve_config(config)


def test_retrieval_says_how_many_captions_it_encoded_and_in_how_long(tmp_path, monkeypatch):
    spec = task_spec("retrieval")
    terminal = _terminal(monkeypatch)
    spec.build_data(_config("retrieval", tmp_path, quiet=False, progress_bar=True))
    said = terminal.getvalue()
    assert "encode captions: 100%" in said  # the bar, on a terminal
    (line,) = [line for line in said.splitlines() if line.startswith("retrieval: ")]
    assert re.fullmatch(r"retrieval: 66 captions of train, val, test, test_shuffled encoded by \w+Encoder "
                        r"in \d+\.\d s; the encoder loaded in \d+\.\d s", line), line
    # the vectors are cached now: nothing to say
    _clear(terminal)
    spec.build_data(_config("retrieval", tmp_path, quiet=False, progress_bar=True))
    assert "retrieval: " not in terminal.getvalue()
    _clear(terminal)
    # quiet: neither bar nor line, on a terminal too
    spec.build_data(_config("retrieval", tmp_path / "other", quiet=True, progress_bar=True))
    assert terminal.getvalue() == ""


def test_chimera_says_what_it_encoded_and_how_its_head_was_trained(tmp_path, capsys):
    spec = task_spec("chimera")
    config = _config("chimera", tmp_path, quiet=False)
    capsys.readouterr()  # transformers' bar writing the tiny BERT of the configuration
    data = spec.build_data(config)
    module = spec.build_module(config, data)
    spec.prepare_module(module, config, data, resuming=False)
    err = capsys.readouterr().err.splitlines()
    assert "%|" not in "".join(err)  # stderr is not a terminal here: no bar
    encoded, trained = [line for line in err if line.startswith("chimera: ")]
    assert re.fullmatch(r"chimera: 12 captions of val, test, test_shuffled encoded by MiniLMEncoder in \d+\.\d s",
                        encoded), encoded
    assert re.fullmatch(r"chimera: masked-LM head trained 6 epochs on 16 captions in \d+\.\d s "
                        r"\(held-out NLL \d+\.\d{3}, unigram \d+\.\d{3}\); kept in .*lm_head_\w+\.safetensors",
                        trained), trained
    spec.prepare_module(module, config, data, resuming=True)  # the head from the cache: nothing said
    assert "masked-LM head" not in capsys.readouterr().err


def test_is_terminal_reads_the_stream_it_is_given_and_a_broken_one_is_not(monkeypatch):
    from polyfuse.progress import is_terminal

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # the default stream: not a terminal
    assert is_terminal(Terminal()) and not is_terminal()
    closed = io.StringIO()
    closed.close()  # isatty of a closed stream raises ValueError
    assert not is_terminal(closed) and not is_terminal(object())


def test_a_bar_on_a_terminal_of_unknown_size_gets_columns_and_lines(monkeypatch):
    terminal = _terminal(monkeypatch)  # a StringIO: no file descriptor, so no size of its own
    monkeypatch.setenv("COLUMNS", "50")
    monkeypatch.setenv("LINES", "7")
    with progress_bar(total=3) as bar:
        assert (bar.ncols, bar.nrows, bar.dynamic_ncols) == (50, 7, False)
        bar.update()  # one step by default, drawn or not
    assert bar.n == 1 and len(terminal.getvalue().rstrip().split("\r")[-1]) <= 50
    monkeypatch.delenv("COLUMNS")
    monkeypatch.delenv("LINES")
    monkeypatch.setattr(polyfuse.progress.shutil, "get_terminal_size",
                        lambda fallback: __import__("os").terminal_size(fallback))
    with progress_bar(total=3) as fallback:
        assert (fallback.ncols, fallback.nrows) == (80, 24)
    with progress_bar(total=3, show=False) as hidden:
        hidden.update()
    assert hidden.n == 1
    # a terminal that knows its size: tqdm follows it as it changes
    monkeypatch.setattr(polyfuse.progress, "_columns", lambda stream: 120)
    with progress_bar(total=3) as sized:
        assert sized.dynamic_ncols


def test_a_bar_on_a_real_terminal_follows_its_size(monkeypatch):
    import fcntl
    import os
    import struct
    import termios

    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))  # 30 lines, 100 columns
    with os.fdopen(follower, "w") as stream, os.fdopen(leader, "rb", buffering=0):
        monkeypatch.setattr(sys, "stderr", stream)
        monkeypatch.setattr(polyfuse.progress, "BAR_DELAY", 0.0)
        with progress_bar(total=2) as bar:
            assert bar.dynamic_ncols  # tqdm reads the terminal's size as it changes
