"""The bidirectional LSTM encoder of captioning (polyfuse.nn.bilstm): each padded sequence
as if run alone, against nn.LSTM and the LSTM equations by hand; padding anywhere leaves
the real steps' states unchanged; sizes and edges."""

from __future__ import annotations

import pytest
import torch

from polyfuse.nn.bilstm import BiLSTMEncoder


def _lstm_by_hand(lstm: torch.nn.LSTM, x: torch.Tensor, suffix: str) -> torch.Tensor:
    """(T, d) -> (T, H): the LSTM equations (PyTorch's gate order i, f, g, o) in float64."""
    w_ih, w_hh = (getattr(lstm, f"weight_{kind}_l0{suffix}").double() for kind in ("ih", "hh"))
    bias = (getattr(lstm, f"bias_ih_l0{suffix}") + getattr(lstm, f"bias_hh_l0{suffix}")).double()
    h = c = torch.zeros(lstm.hidden_size, dtype=torch.float64)
    states = []
    for step in x.double():
        i, f, g, o = (w_ih @ step + w_hh @ h + bias).chunk(4)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        states.append(h)
    return torch.stack(states)


def test_the_bilstm_encoder_equals_each_sequence_run_alone() -> None:
    torch.manual_seed(0)
    encoder = BiLSTMEncoder(5, 3).eval()
    lengths = [6, 2, 1, 4]
    x = torch.randn(4, 6, 5)
    mask = torch.arange(6) < torch.tensor(lengths).unsqueeze(1)
    out = encoder(x, mask)
    assert out.shape == (4, 6, 6)
    for b, length in enumerate(lengths):
        real = x[b, :length]
        alone, _ = encoder.lstm(real.unsqueeze(0))  # nn.LSTM on the unpadded sequence
        torch.testing.assert_close(out[b, :length], alone[0], atol=1e-6, rtol=0)
        # The equations by hand: the forward states, then the backward ones read from the end.
        forward = _lstm_by_hand(encoder.lstm, real, "")
        backward = _lstm_by_hand(encoder.lstm, real.flip(0), "_reverse").flip(0)
        torch.testing.assert_close(out[b, :length].double(), torch.cat([forward, backward], -1), atol=1e-6, rtol=0)
        assert (out[b, length:] == 0).all()


def test_padding_does_not_change_the_states_of_real_steps() -> None:
    torch.manual_seed(1)
    encoder = BiLSTMEncoder(4, 3).eval()
    real = torch.randn(2, 3, 4)
    reference = encoder(real, torch.ones(2, 3, dtype=torch.bool))
    # The same real steps with padding (large values) after them, and between them.
    padded = torch.full((2, 7, 4), 100.0)
    padded[:, :3] = real
    after = torch.zeros(2, 7, dtype=torch.bool)
    after[:, :3] = True
    torch.testing.assert_close(encoder(padded, after)[:, :3], reference, atol=1e-6, rtol=0)
    spread = torch.full((2, 7, 4), -50.0)
    positions = [1, 4, 5]
    spread[:, positions] = real
    between = torch.zeros(2, 7, dtype=torch.bool)
    between[:, positions] = True
    out = encoder(spread, between)
    torch.testing.assert_close(out[:, positions], reference, atol=1e-6, rtol=0)
    assert (out[:, [0, 2, 3, 6]] == 0).all()
    # A sample without real steps is all zero.
    assert (encoder(padded, torch.zeros(2, 7, dtype=torch.bool)) == 0).all()


def test_bilstm_encoder_sizes_and_edges():
    torch.manual_seed(0)
    encoder = BiLSTMEncoder(1, 1)  # the smallest sizes are valid
    assert encoder.output_dim == 2
    one = encoder(torch.randn(1, 1, 1), torch.ones(1, 1, dtype=torch.bool))  # one sample of one step
    assert one.shape == (1, 1, 2) and bool((one != 0).all())
    wide = BiLSTMEncoder(3, 5)
    assert wide.output_dim == 10
    for batch, steps in ((0, 4), (2, 0)):
        empty = wide(torch.randn(batch, steps, 3), torch.ones(batch, steps, dtype=torch.bool))
        assert empty.shape == (batch, steps, 10)
    for sizes in ((0, 5), (3, 0)):
        with pytest.raises(ValueError, match=rf"sizes must be positive, got input_dim={sizes[0]}, hidden_dim={sizes[1]}"):
            BiLSTMEncoder(*sizes)
    with pytest.raises(ValueError, match=r"got \(2, 4, 3\) and \(2, 4\) \(torch.int64\)"):
        wide(torch.randn(2, 4, 3), torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"and \(2, 3\) \(torch.bool\)"):
        wide(torch.randn(2, 4, 3), torch.ones(2, 3, dtype=torch.bool))
