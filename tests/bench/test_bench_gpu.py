"""``polyfuse bench gpu`` at tiny sizes on the CPU (the GPU run is the documented command),
and the CUDA timer's logic with stand-ins for CUDA's events."""

import dataclasses
import json

import pytest
import torch

import polyfuse
from polyfuse.bench.gpu import QUICK, crossover_length, gpu_markdown, run_gpu_bench
from polyfuse.cli.main import main

# Eager backend (the same capture as inductor, no code generation), no crossover unless asked.
TINY = dataclasses.replace(QUICK, crossover_lengths=(), lengths=(3, 4))


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: two on a shared 2-core machine make oneDNN wait on each other."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_every_cell_is_timed_and_measured():
    payload = run_gpu_bench(dataclasses.replace(TINY, modules=("concat", "lmf")))
    rows = payload["rows"]
    assert [(r["module"], r["length"], r["precision"]) for r in rows] == [
        ("concat", 3, "fp32"), ("concat", 3, "bf16"), ("concat", 4, "fp32"), ("concat", 4, "bf16"),
        ("lmf", 3, "fp32"), ("lmf", 3, "bf16"), ("lmf", 4, "fp32"), ("lmf", 4, "bf16")]
    for row in rows:
        compiled_here = row["length"] == 3  # compiled_grid="first": the first batch and length only
        expected = {"eager/forward", "eager/forward_backward"} | (
            {"compiled/forward", "compiled/forward_backward"} if compiled_here else set())
        assert set(row["cells"]) == expected
        for cell in row["cells"].values():
            assert cell["first_quartile_ms"] <= cell["median_ms"] <= cell["third_quartile_ms"]
            assert cell["peak_bytes"] > 0
        if compiled_here:
            assert set(row["speedup"]) == {"forward", "forward_backward"}
            tolerance = 1e-5 if row["precision"] == "fp32" else 1e-2
            assert row["max_abs_difference"] <= tolerance
    assert payload["settings"]["timer"] == "perf_counter" and payload["machine"]["device"] == "cpu"
    report = gpu_markdown(payload, "polyfuse bench gpu --quick")
    assert "the CPU" in report and "not a GPU measurement" in report
    assert report.count("\n| lmf |") == 4 and "| concat | 2 | 4 | fp32 |" in report


def test_a_failing_cell_records_its_error_and_the_run_goes_on(monkeypatch):
    original = polyfuse.nn.MAN.fuse

    def fuse_refusing_autocast(self, inputs, masks):
        if torch.is_autocast_enabled("cpu"):
            raise ValueError("modality 0: features have dtype torch.float32 and values torch.bfloat16")
        return original(self, inputs, masks)

    monkeypatch.setattr(polyfuse.nn.MAN, "fuse", fuse_refusing_autocast)
    payload = run_gpu_bench(dataclasses.replace(TINY, modules=("man", "concat"), lengths=(3,), compiled=False))
    cells = {(r["module"], r["precision"]): r["cells"] for r in payload["rows"]}
    for pass_name in ("forward", "forward_backward"):
        assert "median_ms" in cells["man", "fp32"][f"eager/{pass_name}"]
        assert cells["man", "bf16"][f"eager/{pass_name}"] == {
            "error": "ValueError: modality 0: features have dtype torch.float32 and values torch.bfloat16"}
        assert "median_ms" in cells["concat", "bf16"][f"eager/{pass_name}"]
    assert "error: ValueError: modality 0" in gpu_markdown(payload, "polyfuse bench gpu")


def test_crossover_times_both_modes_and_bounds_exact():
    settings = dataclasses.replace(TINY, modules=(), crossover_lengths=(2, 3, 4),
                                   exact_memory_bound=4000)
    # predicted_tensor_bytes: 4 bytes x (batch 2 x 2 heads x T^3) x (5 + 3 x 2 / T): 3,024 at
    # T = 3 and 6,656 at T = 4, so exact runs at T = 2 and 3 only.
    crossover = run_gpu_bench(settings)["crossover"]
    lengths = [point["length"] for point in crossover["points"]]
    assert lengths == [2, 3, 4]
    for point in crossover["points"]:
        assert point["had"]["forward"]["median_ms"] > 0 and point["had"]["forward_backward"]["median_ms"] > 0
    assert "median_ms" in crossover["points"][1]["exact"]["forward"]
    assert "above the bound" in crossover["points"][2]["exact"]["not_run"]
    assert crossover["forward"]["reading"]  # what the times say (they are not asserted)


def test_crossover_reading_by_hand():
    assert crossover_length([50, 100, 200], [6.8, 19.6, 133.0], [9.6, 9.8, 10.0]) == {
        "length": 100, "reading": "had faster than exact from T = 100"}
    assert crossover_length([50, 100], [9.0, 19.6], [8.0, 9.8])["reading"].startswith("had faster at every length")
    assert crossover_length([50, 100, 400], [1.0, 2.0, None], [3.0, 4.0, 5.0]) == {
        "length": None, "reading": "exact faster up to T = 100, the longest it ran"}
    assert crossover_length([50], [None], [1.0])["reading"] == "no length where both modes ran"


def test_time_budget_stops_new_rows():
    payload = run_gpu_bench(dataclasses.replace(TINY, modules=("concat",), time_budget_s=0.0))
    assert all(row["not_run"] == "time budget of 0 s spent" for row in payload["rows"])


def test_cli_writes_json_and_report(tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["bench", "gpu", "--quick", "--modules", "concat", "--precisions", "fp32", "--crossover-lengths", "2",
                 "--threads", "1", "--output-dir", str(out), "--quiet"])
    assert code == 0
    payload = json.loads((out / "gpu_cpu.json").read_text())
    assert payload["benchmark"] == "gpu" and [r["module"] for r in payload["rows"]] == ["concat"]
    assert (out / "gpu_cpu.md").read_text().startswith("## Every module on the CPU")
    assert "| concat | 2 | 3 | fp32 |" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", "gpu", "--output-dir", str(tmp_path), "--quiet"]) != 0  # the default device is cuda
    assert "CUDA is not available" in capsys.readouterr().err


def test_cuda_event_timer_synchronises_and_reads_milliseconds(monkeypatch):
    """cuda_event_seconds with stand-ins for CUDA's events: it synchronises before the
    call, records the start and end events around it, waits for the end and turns the
    events' milliseconds into seconds."""
    from polyfuse.bench.measure import cuda_event_seconds

    log = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing
            self.stamp = None

        def record(self):
            self.stamp = len(log)
            log.append("record")

        def synchronize(self):
            log.append("wait")

        def elapsed_time(self, end):
            return 250.0 * (end.stamp - self.stamp)  # ms

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("synchronize"))
    seconds = cuda_event_seconds(lambda: log.append("call"))
    assert log == ["synchronize", "record", "call", "record", "wait"]
    assert seconds == pytest.approx(0.5)  # 2 steps of 250 ms


def test_benchmarks_md_says_where_no_gpu_result_is_recorded(tmp_path):
    """docs/BENCHMARKS.md quotes the issue's GPU figures as the issue's until a CUDA run of
    ``bench gpu`` is in the results (whose gpu.md is then its section)."""
    import importlib.util
    from pathlib import Path

    from polyfuse.bench.results import write_results

    path = Path(__file__).resolve().parents[2] / "scripts" / "write_benchmarks_md.py"
    spec = importlib.util.spec_from_file_location("write_benchmarks_md", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    section = script.gpu_status_section(tmp_path)
    assert section[0] == "## On the GPU: not yet recorded from this repository"
    assert any("**Measured by the issue on main 71d5fea**" in line for line in section)
    write_results(tmp_path / "gpu.json", {"benchmark": "gpu", "settings": {"device": "cpu"}})
    assert script.gpu_status_section(tmp_path) == section  # a CPU run is not a GPU result
    write_results(tmp_path / "gpu.json", {"benchmark": "gpu", "settings": {"device": "cuda:0"}})
    assert script.gpu_status_section(tmp_path) == []
