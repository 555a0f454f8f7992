"""``polyfuse bench captioning``: the decoder step it times is the decoder's own step."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from polyfuse.bench.captioning import QUICK, _step
from polyfuse.cli.main import main
from polyfuse.nn.decoding import CaptionDecoder


def test_timed_step_is_the_decoder_step_with_low_rank_or_exact_terms() -> None:
    for low_rank, term in ((False, "HOCA"), (True, "LowRankHOCA")):
        output = _step(QUICK, 3, "T", low_rank)()
        assert output.logits.shape == (QUICK.batch, QUICK.vocab_size)
        torch.manual_seed(QUICK.seed)
        decoder = CaptionDecoder([QUICK.feature_dim] * 3, QUICK.vocab_size, embed_dim=QUICK.feature_dim,
                                 hidden_dim=QUICK.hidden_dim, orders="T", low_rank=low_rank,
                                 attention_dim=QUICK.attention_dim, max_lengths=QUICK.length)
        assert type(decoder.maf.terms["0_1_2"]).__name__ == term


def test_cli_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    assert main(["bench", "captioning", "--preset", "quick", "--output-dir", str(tmp_path), "--threads", "1",
                 "--quiet"]) == 0
    payload = json.loads((tmp_path / "captioning.json").read_text())
    assert [(r["orders"], r["modalities"]) for r in payload["rows"]] == [("T", 3), ("T", 4)]
    assert all(r["exact_seconds"] > 0 and r["low_rank_seconds"] > 0 for r in payload["rows"])
    markdown = (tmp_path / "captioning.md").read_text()
    assert "| T | 4 |" in markdown and "load average" in markdown
    assert (tmp_path / "captioning_decoder_step.png").is_file()
