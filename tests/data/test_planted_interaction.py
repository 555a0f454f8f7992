"""The demo's planted-interaction generator places what its docstring says it does."""

import pytest
import torch

from polyfuse.cli.main import main
from polyfuse.data.synthetic import planted_interaction


def chunk_of(step, length, chunks):
    return step * chunks // length  # the relative chunk of MAN's LSC (note 3)


def event_steps(x, key):
    """Steps whose projection on the key direction is far above the noise."""
    return (x @ key > 4.0).nonzero().flatten().tolist()


def test_label_is_the_parity_of_the_aligned_signs_and_events_sit_where_promised():
    chunks, distractors = 4, 1
    data = planted_interaction(
        64, lengths=(8, 10, 12), feature_dims=(16, 12, 8), chunks=chunks,
        distractors=distractors, noise=0.0, signal=3.0, seed=3,
    )
    assert len(data) == 64 and data.labels.abs().eq(1).all()
    aligned_events = []
    for b in range(64):
        signs, aligned_chunks, other_chunks = [], set(), []
        for j, (x, mask) in enumerate(zip(data.inputs, data.masks, strict=True)):
            length = int(mask[b].sum())
            assert mask[b, :length].all() and not mask[b, length:].any()  # padding at the end
            assert torch.all(x[b, length:] == 0)
            # Without noise, real steps are zero except at the events.
            active = x[b].abs().sum(-1).nonzero().flatten().tolist()
            assert len(active) == 1 + distractors
            aligned = int(data.aligned_steps[b, j])
            assert aligned in active and aligned < length
            aligned_chunks.add(chunk_of(aligned, length, chunks))
            other_chunks += [chunk_of(t, length, chunks) for t in active if t != aligned]
            # Every event is key + sign * sign_direction, all of the same size.
            norms = x[b, active].norm(dim=-1)
            torch.testing.assert_close(norms, torch.full_like(norms, 3.0 * 2**0.5))
            signs.append(x[b, aligned])
        assert len(aligned_chunks) == 1  # the aligned events share one chunk
        assert len(set(other_chunks)) == len(other_chunks)  # no two distractors share one
        assert aligned_chunks.isdisjoint(other_chunks)
        aligned_events.append(signs)
    # Each aligned event is 3 (key + sign * direction): two possible vectors per
    # modality, one per sign. Relative to sample 0, the signs multiply to the ratio
    # of the labels: the label is the parity of the aligned signs.
    for j in range(3):
        distinct = []
        for events in aligned_events:
            if not any(torch.allclose(events[j], seen) for seen in distinct):
                distinct.append(events[j])
        assert len(distinct) == 2
    for b in range(1, 64):
        relative = 1.0
        for j in range(3):
            relative *= 1.0 if torch.allclose(aligned_events[b][j], aligned_events[0][j]) else -1.0
        assert data.labels[b] * data.labels[0] == relative
    assert set(data.labels.tolist()) == {-1.0, 1.0}


def test_same_seed_same_data_and_bad_arguments_are_refused():
    first = planted_interaction(10, seed=1)
    second = planted_interaction(10, seed=1)
    for a, b in zip(first.inputs, second.inputs, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.inputs[0], planted_interaction(10, seed=2).inputs[0])
    with pytest.raises(ValueError, match="at least 7 chunks"):
        planted_interaction(10, chunks=4, distractors=2)
    with pytest.raises(ValueError, match="num_modalities must be >= 2"):
        planted_interaction(10, num_modalities=1)


def test_demo_command_prints_a_table_of_all_methods(capsys):
    assert main(["demo", "--samples", "60", "--epochs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for label in ("MAN (had)", "MAN (exact)", "BAN (modalities 0, 1)", "Concat", "TFN (light)", "LMF (light)"):
        assert f"| {label} |" in out
    assert main(["demo", "--samples", "5"]) == 2
    assert "error: --samples must be >= 20" in capsys.readouterr().err
