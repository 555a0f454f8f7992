"""The captioning model and task: <unk> at decoding, the per-modality encoders (the
BiLSTM encoder itself: tests/nn/test_bilstm.py)."""

from __future__ import annotations

import torch

from polyfuse.data.formats.captioning import UNKNOWN, Vocabulary
from polyfuse.nn.models.captioner import VideoCaptioner
from polyfuse.tasks.captioning.spec import CaptioningConfig, CaptioningTask

WORDS = ["<pad>", "<bos>", "<eos>", UNKNOWN, "a", "dog", "runs"]


def _captioner(seed: int = 0, **options) -> VideoCaptioner:
    torch.manual_seed(seed)
    return VideoCaptioner([5, 3], len(WORDS), orders="UB", low_rank=False, max_lengths=[4, 2], feature_dim=6,
                          embed_dim=4, hidden_dim=8, attention_dim=4, dropout=0.0, **options).eval()


def _inputs() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(3, 4, 5, generator=generator), torch.randn(3, 2, 3, generator=generator)]
    masks = [torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)]
    return inputs, masks


def test_the_task_never_generates_unknown_unless_allowed() -> None:
    model = _captioner()
    with torch.no_grad():  # <unk> is the most probable word at every step, "dog" the next
        model.decoder.state_output.bias[WORDS.index(UNKNOWN)] += 50.0
        model.decoder.state_output.bias[WORDS.index("dog")] += 25.0
    vocabulary = Vocabulary(WORDS)
    inputs, masks = _inputs()
    default = CaptioningTask(model, vocabulary, beam_size=3, max_length=5)
    tokens = default.generate(inputs, masks).tokens
    assert not (tokens == 3).any() and (tokens == WORDS.index("dog")).any(dim=1).all()
    allowed = CaptioningTask(model, vocabulary, beam_size=3, max_length=5, allow_unknown=True)
    assert (allowed.generate(inputs, masks).tokens == 3).any(dim=1).all()


def test_the_captioning_section_bans_unknown_by_default() -> None:
    section = CaptioningConfig(features={"a": "a.npz"}, captions="c.json", splits="s.json")
    assert section.allow_unknown is False
    assert CaptioningConfig(features={"a": "a.npz"}, captions="c.json", splits="s.json", allow_unknown=True).allow_unknown


def test_the_captioner_encodes_with_a_bilstm_by_default_and_linear_on_request() -> None:
    inputs, masks = _inputs()
    bilstm = _captioner()
    encoded = bilstm.encode(inputs, masks)
    assert [x.shape[-1] for x in encoded] == [12, 12]  # 2 x feature_dim
    alone, _ = bilstm.encoders[0].lstm(inputs[0][1:2, :2])  # video 1 has 2 real steps
    torch.testing.assert_close(encoded[0][1, :2], alone[0], atol=1e-6, rtol=0)
    linear = _captioner(encoder="linear")
    assert [x.shape[-1] for x in linear.encode(inputs, masks)] == [6, 6]
    assert "encoders.0.0.weight" in linear.state_dict()  # the layout of checkpoints before 0.3.0
