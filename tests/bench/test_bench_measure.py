"""The measuring helpers: timing, peak memory, load, sizes."""

import pytest
import torch

from polyfuse.bench.measure import (
    LoadMonitor,
    Timing,
    count_flops,
    machine_info,
    peak_allocated_bytes,
    time_callable,
    time_interleaved,
)
from polyfuse.bench.results import format_bytes, parse_bytes


def test_time_interleaved_calls_in_turns_and_summarises():
    calls = []
    timings = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                               warmup=1, repeats=3)
    assert calls == ["a", "b"] * 4
    for timing in timings.values():
        assert isinstance(timing, Timing) and timing.repeats == 3
        assert 0 <= timing.minimum <= timing.median <= timing.maximum
    assert time_callable(lambda: None, warmup=0, repeats=2).repeats == 2
    with pytest.raises(ValueError, match="repeats"):
        time_callable(lambda: None, repeats=0)


def test_peak_memory_counts_live_tensors_not_freed_ones():
    size = 1 << 20  # 1 MiB of float32

    def sequential():
        for _ in range(3):
            torch.empty(size // 4).fill_(1)  # freed before the next one

    def together():
        kept = [torch.empty(size // 4).fill_(1) for _ in range(3)]
        return kept

    peak_sequential = peak_allocated_bytes(sequential)
    peak_together = peak_allocated_bytes(together)
    assert peak_sequential is not None and peak_together is not None
    assert size <= peak_sequential < 1.5 * size
    assert 3 * size <= peak_together < 3.5 * size


def test_count_flops_of_a_matrix_product():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    assert count_flops(lambda: a @ b) == 2 * 3 * 4 * 5


def test_load_monitor_and_machine_info():
    with LoadMonitor() as monitor:
        torch.randn(200, 200) @ torch.randn(200, 200)
    result = monitor.result()
    assert {"seconds", "cpus", "loadavg_1min", "machine_busy", "own", "others", "steal"} <= set(result)
    if result["machine_busy"] is not None:
        assert 0 <= result["others"] <= 1 and 0 <= result["own"] <= 1
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["torch_threads"] == torch.get_num_threads()


def test_byte_sizes():
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("1e9") == 10**9
    assert parse_bytes(7) == 7
    with pytest.raises(ValueError, match="cannot read"):
        parse_bytes("lots")
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2**30) == "3.0 GiB"
    assert format_bytes(None) == "n/a"


def test_paired_ratio_is_the_median_of_per_round_ratios():
    from polyfuse.bench.measure import paired_ratio

    samples = {"slow": [10.0, 30.0, 12.0, 50.0, 9.0], "fast": [1.0, 2.0, 2.0, 10.0, 1.0]}
    ratios = sorted([10.0, 15.0, 6.0, 5.0, 9.0])  # per round, by hand
    result = paired_ratio(samples, "slow", "fast")
    assert result["median"] == 9.0 and result["rounds"] == 5
    assert result["minimum"] == ratios[0] and result["maximum"] == ratios[-1]
    assert result["first_quartile"] == 6.0 and result["third_quartile"] == 10.0  # inclusive quartiles
    # A ratio of medians would give 12 / 2 = 6 here: the pairing matters.
    assert result["median"] != 12.0 / 2.0


def test_had_backward_memory_does_not_grow_with_the_length(monkeypatch):
    """The custom backward recomputes per chunk: beyond the inputs and their gradients,
    the peak of forward + backward grows from T = 40 to T = 160 by at most two more
    copies of the inputs (the stacked feature rows and their gradient, O(T K')), not
    like the (G, N, T, H) random features (H = 64 here, 8 times the feature size)."""
    import polyfuse.functional as F
    from polyfuse.bench.measure import peak_allocated_bytes
    from polyfuse.functional import _had

    monkeypatch.setitem(_had.CHUNK_BYTES, "cpu", 64 << 10)
    generator = torch.Generator().manual_seed(0)
    extra = {}
    for length in (40, 160):
        features = [(torch.randn(4, 2, length, 8, generator=generator) * 0.3).requires_grad_() for _ in range(3)]
        values = [torch.randn(4, 2, length, 8, generator=generator).requires_grad_() for _ in range(3)]
        matrix = torch.randn(2, 64, 8, generator=generator)

        def step(features=features, values=values, matrix=matrix):
            F.multilinear_attention(features, values, mode="had", random_matrix=matrix).sum().backward()

        step()
        for t in (*features, *values):
            t.grad = None
        peak = peak_allocated_bytes(step)
        if peak is None:
            pytest.skip("this torch build exposes no allocation events")
        inputs = sum(t.numel() * t.element_size() for t in (*features, *values))
        extra[length] = (peak - 2 * inputs, inputs)  # inputs' gradients are as large as the inputs
    growth = extra[160][0] - extra[40][0]
    input_growth = extra[160][1] - extra[40][1]
    exponent_growth = 4 * 2 * 3 * (160 - 40) * 64 * 4  # one (G, N, T, H) float32 tensor
    assert growth <= 2 * input_growth
    assert growth < 0.5 * exponent_growth
