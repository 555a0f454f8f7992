"""Log-mel features against oracles written here: the HTK triangles computed bin by bin,
the power spectrum of one window with numpy's FFT, a pure tone's band, and segment
statistics computed by slicing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from polyfuse.functional.audio import (
    hz_to_mel,
    log_mel_spectrogram,
    mel_filterbank,
    mel_to_hz,
    segment_mean_std,
)


def test_mel_scale_known_values_and_round_trip():
    # HTK: mel(700 Hz) = 2595 log10(2); mel(1000 Hz) = 999.99 (the scale's anchor)
    values = hz_to_mel(torch.tensor([0.0, 700.0, 1000.0], dtype=torch.float64))
    np.testing.assert_allclose(values.numpy(), [0.0, 2595 * math.log10(2), 999.985], atol=1e-3)
    hertz = torch.tensor([0.0, 123.0, 4000.0, 8000.0], dtype=torch.float64)
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(hertz)).numpy(), hertz.numpy(), rtol=1e-12)


@pytest.mark.parametrize(("n_fft", "n_mels", "rate", "f_min", "f_max"), [(400, 64, 16000, 0.0, None), (64, 5, 8000, 100.0, 3000.0), (300, 20, 16000, 0.0, None)])
def test_mel_filterbank_matches_triangles_computed_bin_by_bin(n_fft, n_mels, rate, f_min, f_max):
    top = rate / 2 if f_max is None else f_max
    low_mel, high_mel = 2595 * math.log10(1 + f_min / 700), 2595 * math.log10(1 + top / 700)
    corners = [700 * (10 ** ((low_mel + i * (high_mel - low_mel) / (n_mels + 1)) / 2595) - 1) for i in range(n_mels + 2)]
    expected = np.zeros((n_fft // 2 + 1, n_mels))
    for k in range(n_fft // 2 + 1):
        f = k * rate / n_fft
        for j in range(n_mels):
            left, centre, right = corners[j], corners[j + 1], corners[j + 2]
            if left <= f <= centre:
                expected[k, j] = (f - left) / (centre - left)
            elif centre < f <= right:
                expected[k, j] = (right - f) / (right - centre)
    got = mel_filterbank(n_fft // 2 + 1, n_mels, rate, f_min=f_min, f_max=f_max).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-9)


def test_mel_filterbank_refuses_bad_ranges():
    ranges = r"^mel_filterbank: need 0 <= f_min < f_max <= sample_rate / 2, got "
    with pytest.raises(ValueError, match=ranges + r"0\.0, 9000\.0, 16000$"):
        mel_filterbank(201, 10, 16000, f_max=9000.0)
    with pytest.raises(ValueError, match=ranges + r"-1\.0, 8000\.0, 16000$"):
        mel_filterbank(201, 10, 16000, f_min=-1.0)
    with pytest.raises(ValueError, match=ranges + r"300\.0, 300\.0, 16000$"):
        mel_filterbank(201, 10, 16000, f_min=300.0, f_max=300.0)
    sizes = r"^mel_filterbank: need n_freqs >= 2 and n_mels >= 1, got "
    with pytest.raises(ValueError, match=sizes + "201 and 0$"):
        mel_filterbank(201, 0, 16000)
    with pytest.raises(ValueError, match=sizes + "1 and 3$"):
        mel_filterbank(1, 3, 16000)


def test_mel_filterbank_smallest_sizes_by_hand():
    """One band at 4 kHz, corners 0, mel^-1(mel(2000) / 2) and 2000 Hz. With two bins (0 and
    2000 Hz) both sit on the corners: weight 0; with three, 1000 Hz is inside the triangle."""
    middle = 700 * (10 ** ((2595 * math.log10(1 + 2000 / 700) / 2) / 2595) - 1)
    got = mel_filterbank(2, 1, 4000)
    assert got.shape == (2, 1) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), [[0.0], [0.0]], atol=1e-12)
    # three bins: 0, 1000, 2000 Hz; the middle one lies on the rising side of the triangle
    got = mel_filterbank(3, 1, 4000).numpy()
    expected = max(0.0, min(1000 / middle, (2000 - 1000) / (2000 - middle)))  # min(rising, falling)
    np.testing.assert_allclose(got[:, 0], [0.0, expected, 0.0], rtol=1e-12)


def test_log_mel_of_one_window_matches_numpy_fft():
    rng = np.random.default_rng(0)
    wave = rng.standard_normal(2000)
    n_fft, hop, rate = 256, 100, 8000
    got = log_mel_spectrogram(torch.from_numpy(wave), rate, n_fft=n_fft, hop_length=hop, n_mels=12)
    assert got.shape == (1 + len(wave) // hop, 12)
    padded = np.concatenate([np.zeros(n_fft // 2), wave, np.zeros(n_fft // 2)])  # centred frames
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    filters = mel_filterbank(n_fft // 2 + 1, 12, rate).numpy()
    for frame in (0, 7, 20):
        power = np.abs(np.fft.rfft(padded[frame * hop : frame * hop + n_fft] * window)) ** 2
        np.testing.assert_allclose(got[frame].numpy(), np.log(power @ filters + 1e-6), rtol=1e-9)


def test_log_mel_of_a_float32_wave_is_computed_in_float64():
    # A float32 wave is cast to float64 first (exact), so its features equal those of
    # the same samples given as float64, to float64 precision.
    wave = torch.from_numpy(np.random.default_rng(1).standard_normal(1200).astype(np.float32))
    got = log_mel_spectrogram(wave, 8000, n_fft=128, hop_length=64, n_mels=8)
    assert got.dtype == torch.float64
    expected = log_mel_spectrogram(wave.double(), 8000, n_fft=128, hop_length=64, n_mels=8)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)


@pytest.mark.parametrize("frequency", [440.0, 1000.0, 3000.0])
def test_a_pure_tone_is_loudest_in_the_band_around_it(frequency):
    rate = 16000
    wave = torch.sin(2 * math.pi * frequency * torch.arange(rate, dtype=torch.float64) / rate)
    spectrum = log_mel_spectrogram(wave, rate, n_mels=40)
    corners = mel_to_hz(torch.linspace(0, float(hz_to_mel(torch.tensor(rate / 2.0))), 42, dtype=torch.float64))
    centres = corners[1:-1]
    loudest = spectrum[5:-5].mean(0).argmax().item()  # frames away from the zero padding
    nearest = sorted(range(40), key=lambda j: abs(centres[j].item() - frequency))[:2]
    assert loudest in nearest


def test_log_mel_defaults_are_25_ms_windows_every_10_ms_and_64_bands():
    """At 16 kHz: n_fft 400, hop 160, 64 bands, eps 1e-6 (numpy's FFT as the oracle); a
    float32 wave is computed in float64."""
    rate, n_fft, hop = 16000, 400, 160
    wave = np.random.default_rng(1).standard_normal(1700).astype(np.float32)
    got = log_mel_spectrogram(torch.from_numpy(wave), rate)
    assert got.shape == (1 + 1700 // hop, 64) and got.dtype == torch.float64
    padded = np.concatenate([np.zeros(n_fft // 2), wave.astype(np.float64), np.zeros(n_fft // 2)])
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    filters = mel_filterbank(n_fft // 2 + 1, 64, rate).numpy()
    for frame in (0, 5, 10):
        power = np.abs(np.fft.rfft(padded[frame * hop : frame * hop + n_fft] * window)) ** 2
        np.testing.assert_allclose(got[frame].numpy(), np.log(power @ filters + 1e-6), rtol=1e-9)
    silent = log_mel_spectrogram(torch.zeros(320, dtype=torch.float64), rate)
    np.testing.assert_allclose(silent.numpy(), np.full((3, 64), np.log(1e-6)), rtol=1e-12)  # log(eps)


def test_log_mel_smallest_window_and_hop():
    """n_fft = 2 and hop 1 are accepted: 1 + n frames; with two bins the single band's
    corners sit on them, so its weights are 0 and every entry is log(eps)."""
    wave = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    got = log_mel_spectrogram(wave, 8, n_fft=2, hop_length=1, n_mels=1, eps=0.5)
    np.testing.assert_allclose(got.numpy(), np.full((4, 1), np.log(0.5)), rtol=1e-12)


def test_log_mel_refuses_bad_input():
    with pytest.raises(ValueError, match=r"^log_mel_spectrogram: wave must be one channel \(n,\), got shape \(2, 100\)$"):
        log_mel_spectrogram(torch.zeros(2, 100), 16000)
    with pytest.raises(ValueError, match=r"^log_mel_spectrogram: wave is empty$"):
        log_mel_spectrogram(torch.zeros(0), 16000)
    sizes = "^log_mel_spectrogram: need n_fft >= 2 and hop_length >= 1, got "
    with pytest.raises(ValueError, match=sizes + "1 and 160$"):
        log_mel_spectrogram(torch.zeros(100), 16000, n_fft=1)
    with pytest.raises(ValueError, match=sizes + "400 and 0$"):
        log_mel_spectrogram(torch.zeros(100), 16000, hop_length=0)


@pytest.mark.parametrize(("length", "segments"), [(10, 3), (12, 4), (3, 5), (1, 2), (100, 80)])
def test_segment_mean_std_matches_slices(length, segments):
    sequence = torch.from_numpy(np.random.default_rng(length).standard_normal((length, 3)))
    got = segment_mean_std(sequence, segments).numpy()
    assert got.shape == (segments, 6)
    array = sequence.numpy()
    for k in range(segments):
        start = min(k * length // segments, length - 1)
        stop = max((k + 1) * length // segments, start + 1)
        part = array[start:stop]
        np.testing.assert_allclose(got[k], np.concatenate([part.mean(0), part.std(0)]), atol=1e-12)
    if length >= segments:  # the segments tile the sequence: their weighted means give the mean
        sizes = np.diff([k * length // segments for k in range(segments + 1)])
        np.testing.assert_allclose((got[:, :3] * sizes[:, None]).sum(0) / length, array.mean(0), atol=1e-12)


def test_segment_mean_std_one_segment_is_the_whole_sequence():
    sequence = torch.tensor([[1.0, 0.0], [3.0, 0.0], [8.0, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(
        segment_mean_std(sequence, 1), torch.tensor([[4.0, 1.0, math.sqrt(26 / 3), math.sqrt(2.0)]], dtype=torch.float64)
    )


def test_segment_mean_std_refuses_empty():
    with pytest.raises(ValueError, match=r"^segment_mean_std: sequence must be \(L >= 1, d\), got shape \(0, 3\)$"):
        segment_mean_std(torch.zeros(0, 3), 2)
    with pytest.raises(ValueError, match=r"^segment_mean_std: sequence must be \(L >= 1, d\), got shape \(4,\)$"):
        segment_mean_std(torch.zeros(4), 2)
    with pytest.raises(ValueError, match=r"^segment_mean_std: segments must be >= 1, got 0$"):
        segment_mean_std(torch.zeros(4, 3), 0)
