"""Log-mel audio features and statistics over equal segments of a sequence (pure torch).

Shapes: ``n`` samples, ``L`` frames of a sequence, ``F = n_fft // 2 + 1`` frequency bins,
``M`` mel bands, ``N`` segments, ``d`` features.

The mel scale is HTK's, ``mel(f) = 2595 log10(1 + f / 700)`` (Young et al., The HTK Book,
section 5.4), with triangular filters of peak 1 whose corners are ``M + 2`` points equally
spaced on that scale between ``f_min`` and ``f_max``; no area normalisation.
"""

from __future__ import annotations

import torch

__all__ = ["hz_to_mel", "log_mel_spectrogram", "mel_filterbank", "mel_to_hz", "segment_mean_std"]


def hz_to_mel(hertz: torch.Tensor) -> torch.Tensor:
    """HTK mel of a frequency in Hz, ``2595 log10(1 + f / 700)``."""
    return 2595.0 * torch.log10(1.0 + hertz / 700.0)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    """The inverse of ``hz_to_mel``: ``700 (10^(m / 2595) - 1)``."""
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(
    n_freqs: int, n_mels: int, sample_rate: int, *, f_min: float = 0.0, f_max: float | None = None
) -> torch.Tensor:
    """``(F, M)`` float64: the weight of FFT bin ``k`` (frequency ``k * sample_rate / n_fft``,
    ``n_fft = 2 (F - 1)``) in band ``j``, a triangle rising from corner ``j`` to ``j + 1``
    and falling to ``j + 2``."""
    f_max = sample_rate / 2 if f_max is None else f_max
    if not 0 <= f_min < f_max <= sample_rate / 2:
        raise ValueError(f"mel_filterbank: need 0 <= f_min < f_max <= sample_rate / 2, got {f_min}, {f_max}, {sample_rate}")
    if n_freqs < 2 or n_mels < 1:
        raise ValueError(f"mel_filterbank: need n_freqs >= 2 and n_mels >= 1, got {n_freqs} and {n_mels}")
    bins = torch.linspace(0, sample_rate / 2, n_freqs, dtype=torch.float64)  # (F,)
    edges = torch.tensor([f_min, f_max], dtype=torch.float64)
    corners = mel_to_hz(torch.linspace(*hz_to_mel(edges).tolist(), n_mels + 2, dtype=torch.float64))
    lower, centre, upper = corners[:-2], corners[1:-1], corners[2:]  # (M,) each
    rising = (bins[:, None] - lower) / (centre - lower)
    falling = (upper - bins[:, None]) / (upper - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0.0)


def log_mel_spectrogram(
    wave: torch.Tensor,
    sample_rate: int,
    *,
    n_fft: int = 400,
    hop_length: int = 160,
    n_mels: int = 64,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``(n,)`` samples -> ``(L, M)`` ``log(eps + sum_k |STFT_k|^2 W_kj)``, ``L = 1 + n // hop``:
    periodic Hann windows of ``n_fft`` samples every ``hop_length``, centred (zero padding);
    at 16 kHz the defaults are 25 ms windows every 10 ms and 64 bands."""
    if wave.dim() != 1:
        raise ValueError(f"log_mel_spectrogram: wave must be one channel (n,), got shape {tuple(wave.shape)}")
    if wave.numel() == 0:
        raise ValueError("log_mel_spectrogram: wave is empty")
    if n_fft < 2 or hop_length < 1:
        raise ValueError(f"log_mel_spectrogram: need n_fft >= 2 and hop_length >= 1, got {n_fft} and {hop_length}")
    wave = wave.to(torch.float64)
    spectrum = torch.stft(
        wave,
        n_fft,
        hop_length=hop_length,
        window=torch.hann_window(n_fft, dtype=torch.float64),
        center=True,
        pad_mode="constant",
        return_complex=True,
    )  # (F, L)
    power = spectrum.abs().square().transpose(0, 1)  # (L, F)
    filters = mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate)
    return torch.log(power @ filters + eps)


def segment_mean_std(sequence: torch.Tensor, segments: int) -> torch.Tensor:
    """``(L, d)`` -> ``(N, 2 d)``: the mean and the (population) standard deviation of each
    of ``N`` equal segments, rows ``floor(k L / N)`` to ``floor((k + 1) L / N)`` (at least
    one row, so segments repeat rows when ``L < N``)."""
    if sequence.dim() != 2 or sequence.shape[0] == 0:
        raise ValueError(f"segment_mean_std: sequence must be (L >= 1, d), got shape {tuple(sequence.shape)}")
    if segments < 1:
        raise ValueError(f"segment_mean_std: segments must be >= 1, got {segments}")
    length = sequence.shape[0]
    rows = []
    for k in range(segments):
        start = min(k * length // segments, length - 1)
        stop = max((k + 1) * length // segments, start + 1)
        part = sequence[start:stop]
        rows.append(torch.cat([part.mean(0), part.std(0, correction=0)]))
    return torch.stack(rows)

