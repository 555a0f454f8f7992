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


class _Seen:
    """The input and output of a module's calls (forward hooks)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        module.register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:
        self.inputs.append(args[0].detach().clone())
        self.outputs.append((output[0] if isinstance(output, tuple) else output).detach().clone())


def _dropped_or_scaled(dropped: torch.Tensor, kept: torch.Tensor, rate: float) -> bool:
    """Whether ``dropped`` is ``kept`` with some entries zeroed and the rest scaled by 1 / (1 - rate)."""
    zero = dropped == 0
    scaled = torch.isclose(dropped, kept / (1 - rate), rtol=1e-5, atol=1e-7)
    return bool((zero | scaled).all()) and bool((zero & (kept != 0)).any())


def _dropout_run(dropout_at: str, encoder: str = "bilstm") -> dict[str, list[torch.Tensor]]:
    """One teacher-forced pass in train mode (dropout 0.5) and the same weights' encoder
    output in eval mode, with what the hooks saw."""
    torch.manual_seed(0)
    model = VideoCaptioner([5, 3], len(WORDS), orders="UB", low_rank=False, max_lengths=[4, 2], feature_dim=6,
                           embed_dim=4, hidden_dim=8, attention_dim=4, dropout=0.5, encoder=encoder,
                           dropout_at=dropout_at)
    inputs, masks = _inputs()
    captions = torch.tensor([[1, 4, 5, 6, 2], [1, 5, 6, 2, 0], [1, 4, 5, 2, 0]])
    with torch.no_grad():
        clean = model.eval().encode(inputs, masks)
        lstm, output = _Seen(model.decoder.lstm), _Seen(model.decoder.state_output)
        model.train()
        trained = model.encode(inputs, masks)
        model.decoder(captions, trained, masks)
        words = model.decoder.embedding(captions[:, :-1])
    return {"clean": clean, "trained": trained, "lstm_in": lstm.inputs, "lstm_out": lstm.outputs,
            "output_in": output.inputs, "words": [words[:, t] for t in range(words.shape[1])]}


def test_dropout_at_decoder_leaves_the_encoder_output_untouched_and_drops_the_lstm_input_and_output() -> None:
    """HOCA section 5.2: dropout 0.5 on the input and output of the LSTM decoder only."""
    for encoder in ("bilstm", "linear"):
        seen = _dropout_run("decoder", encoder)
        for clean, trained in zip(seen["clean"], seen["trained"], strict=True):  # train mode, no dropout
            assert torch.equal(clean, trained)
        assert len(seen["lstm_in"]) == len(seen["words"]) == 4
        for lstm_in, words in zip(seen["lstm_in"], seen["words"], strict=True):  # the LSTM's input: dropped
            assert _dropped_or_scaled(lstm_in, words, 0.5)
        for output_in, hidden in zip(seen["output_in"], seen["lstm_out"], strict=True):  # h_t before Eq. 22: dropped
            assert _dropped_or_scaled(output_in, hidden, 0.5)


def test_dropout_at_encoder_and_decoder_is_the_default_and_drops_the_encoder_output_too() -> None:
    assert VideoCaptioner([5], len(WORDS), orders="U", low_rank=False, max_lengths=[4]).dropout_at == "encoder+decoder"
    seen = _dropout_run("encoder+decoder")
    for clean, trained in zip(seen["clean"], seen["trained"], strict=True):
        assert _dropped_or_scaled(trained, clean, 0.5)
    assert all(_dropped_or_scaled(a, b, 0.5) for a, b in zip(seen["lstm_in"], seen["words"], strict=True))


def test_dropout_at_is_checked_and_read_from_the_decoder_section() -> None:
    import pytest

    from polyfuse.tasks.captioning.spec import DecoderConfig

    with pytest.raises(ValueError, match="unknown dropout_at 'lstm'"):
        VideoCaptioner([5], len(WORDS), orders="U", low_rank=False, max_lengths=[4], dropout_at="lstm")
    assert DecoderConfig().dropout_at == "encoder+decoder"
    assert DecoderConfig(dropout_at="decoder").dropout_at == "decoder"


def test_the_configured_dropout_place_and_optimizer_reach_the_captioner(tmp_path) -> None:
    from tests.tiny.tasks import TINY

    from polyfuse.engine.config import resolve_config
    from polyfuse.tasks.registry import task_spec

    config = TINY["captioning"](tmp_path)
    config["decoder"] = {**config.get("decoder", {}), "dropout": 0.5, "dropout_at": "decoder"}
    config["optim"] = {"optimizer": "adam", "lr": 1e-4}  # HOCA section 5.2: Adam, 1e-4
    resolved = resolve_config(config)
    spec = task_spec("captioning")
    task = spec.build_module(resolved, spec.build_data(resolved))
    assert task.model.dropout_at == "decoder"
    assert task.model.decoder.dropout.p == 0.5
    assert all(encoder.dropout.p == 0.0 for encoder in task.model.encoders)
    optimizer = task.configure_optimizers()
    assert type(optimizer) is torch.optim.Adam and optimizer.param_groups[0]["lr"] == 1e-4
