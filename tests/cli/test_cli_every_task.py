"""Every documented command on every registered task type's tiny checkpoint (the task
contract test's configurations): ``plot`` (learning curves and attention), ``evaluate``,
``predict`` and ``compare`` exit 0, or fail with one line on stderr, never a traceback
(docs/TRAINING.md: "Errors are one line on stderr"). Where a task's model has attention
to show, ``plot attention`` draws it; Chimera's refusal names the task types that have one.
"""

from __future__ import annotations

import pytest
import yaml
from tests.tiny.tasks import TINY

from polyfuse.cli.main import EXIT_INPUT, main
from polyfuse.engine.run import train
from polyfuse.tasks.registry import attention_task_types, available_tasks, task_spec

#: the tabular tasks' fusion here: two with attention to draw, one without
FUSIONS = {"sentiment": "man", "traits": "ban", "classification": "concat"}
#: the tasks whose tiny model has no attention figure, and what the one-line refusal says
NO_FIGURE = {"classification": "fusion Concat has no attention to plot; MAN and BAN have"}


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny_run(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    config = TINY[request.param](folder)
    config["trainer"] = {**config["trainer"], "max_epochs": 2}
    if request.param in FUSIONS:
        config["model"]["fusion"] = FUSIONS[request.param]
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    result = train(config, run_dir=folder / "run")
    return request.param, folder, path, result


def _run(capfd, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def _one_line_or_success(code: int, err: str, command: str) -> None:
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.strip() and ": warning: " not in line]
    if code != 0:
        assert code == EXIT_INPUT and len(errors) == 1, err
        assert errors[0].startswith(f"polyfuse {command}: error: ")


def test_every_task_type_draws_its_attention():
    assert set(attention_task_types()) == set(available_tasks())


def test_plot_evaluate_predict_on_every_task(tiny_run, capfd, tmp_path):
    name, _, _, result = tiny_run
    best = str(result.best_checkpoint)
    code, out, err = _run(capfd, ["plot", "--run", str(result.run_dir), "--out", str(tmp_path / "curves.png")])
    assert code == 0 and (tmp_path / "curves.png").stat().st_size > 0, err

    code, out, err = _run(capfd, ["plot", "attention", "--checkpoint", best, "--out", str(tmp_path / "att.png")])
    _one_line_or_success(code, err, "plot")
    if name not in NO_FIGURE:
        assert code == 0 and (tmp_path / "att.png").stat().st_size > 0, err
        assert f"wrote {tmp_path / 'att.png'}" in out
    else:
        assert code == EXIT_INPUT and NO_FIGURE[name] in err
    # an option of another task is one line naming the flag
    code, out, err = _run(capfd, ["plot", "attention", "--checkpoint", best, "--question-ids", "0",
                                  "--video", "x", "--out", str(tmp_path / "x.png")])
    if name == "vqa":
        assert code == EXIT_INPUT and "--video do(es) not apply to a vqa checkpoint" in err
    else:
        _one_line_or_success(code, err, "plot")
        assert code == EXIT_INPUT and "--question-ids" in err
    # a sample beyond the split is one line
    code, out, err = _run(capfd, ["plot", "attention", "--checkpoint", best, "--sample", "100000",
                                  "--out", str(tmp_path / "far.png")])
    _one_line_or_success(code, err, "plot")
    assert code == EXIT_INPUT

    code, out, err = _run(capfd, ["evaluate", "--checkpoint", best, "--split", "test"])
    _one_line_or_success(code, err, "evaluate")
    assert code == 0 and out.strip()

    records = tmp_path / f"predictions{task_spec(name).prediction_suffix}"
    code, out, err = _run(capfd, ["predict", "--checkpoint", best, "--split", "test", "--out", str(records)])
    _one_line_or_success(code, err, "predict")
    assert code == 0 and records.stat().st_size > 0


def test_compare_on_every_task(tiny_run, capfd, tmp_path):
    _, _, path, _ = tiny_run
    code, out, err = _run(capfd, ["compare", "--config", str(path), "--models", str(path), "--seeds", "1",
                                  "--max-epochs", "1", "--out", str(tmp_path / "compare")])
    _one_line_or_success(code, err, "compare")
    assert code == 0 and (tmp_path / "compare" / "summary.md").is_file(), err
    assert "tiny" in (tmp_path / "compare" / "summary.md").read_text() and "tiny" in out  # the model's row


@pytest.mark.parametrize("tiny_run", ["captioning"], indirect=True)
def test_a_captioning_checkpoint_draws_the_video_it_is_given(tiny_run, capfd, tmp_path):
    _, _, _, result = tiny_run
    from polyfuse.engine.run import load_model
    from polyfuse.tasks.captioning.spec import checkpoint_captioning_data

    _, extras = load_model(result.best_checkpoint)
    video = checkpoint_captioning_data(extras).splits["test"][1]
    out = tmp_path / "video.png"
    code, _, err = _run(capfd, ["plot", "attention", "--checkpoint", str(result.best_checkpoint),
                                     "--video", video, "--out", str(out)])
    assert code == 0 and out.stat().st_size > 0, err
    code, _, err = _run(capfd, ["plot", "attention", "--checkpoint", str(result.best_checkpoint),
                                     "--video", "no-such-video", "--out", str(out)])
    assert code == EXIT_INPUT and "video 'no-such-video' is not in the checkpoint's data" in err
    # the run-directory form draws the same figure from the run's best checkpoint
    code, _, err = _run(capfd, ["plot", "--captions", str(result.run_dir), "--video", video, "--out", str(out)])
    assert code == 0 and out.stat().st_size > 0, err


def test_the_captions_figure_of_another_task_is_one_line(tiny_run, capfd, tmp_path):
    name, _, _, result = tiny_run
    code, _, err = _run(capfd, ["plot", "--captions", str(result.run_dir), "--video", "v0",
                                "--out", str(tmp_path / "c.png")])
    _one_line_or_success(code, err, "plot")
    if name != "captioning":
        assert code == EXIT_INPUT and f"--video do(es) not apply to a {name} checkpoint" in err



@pytest.mark.parametrize("command", ["evaluate", "predict", "plot"])
def test_wrong_input_to_any_task_is_one_line(tiny_run, capfd, tmp_path, command):
    _, _, _, result = tiny_run
    out = ["--out", str(tmp_path / ("x.png" if command == "plot" else "x.csv"))] if command != "evaluate" else []
    base = [command, "--checkpoint", str(result.best_checkpoint), *out]
    for extra in (["--split", "nosuch"], ["--data", str(tmp_path / "missing.npz")]):
        code, _, err = _run(capfd, [*base, *extra])
        _one_line_or_success(code, err, command)
        assert code == EXIT_INPUT
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(result.best_checkpoint.read_bytes()[:200])
    code, _, err = _run(capfd, [command, "--checkpoint", str(corrupt), *out])
    _one_line_or_success(code, err, command)
    assert code == EXIT_INPUT


@pytest.mark.parametrize("setting", ["devices=2", "num_nodes=2"])
def test_compare_refuses_several_processes_in_one_line(tmp_path, capfd, setting):
    config = TINY["sentiment"](tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    code, _, err = _run(capfd, ["compare", "--config", str(path), "--models", "concat", "--seeds", "1",
                                "--set", f"trainer.{setting}", "--out", str(tmp_path / "compare")])
    _one_line_or_success(code, err, "compare")
    assert code == EXIT_INPUT and "compare trains one run after another in one process" in err
    assert not (tmp_path / "compare").exists()  # refused before anything is written
