"""The paper's variants as configurations: which attention terms each one builds."""

from __future__ import annotations

import pytest
import torch

from polyfuse.nn.decoding import MeanPoolContext
from polyfuse.nn.models.captioner import VideoCaptioner
from polyfuse.tasks.captioning.spec import VARIANTS, variant_settings

# Written out from HOCA Table 2 for three modalities (0 image, 1 motion, 2 audio).
EXPECTED = {
    "HOCA-U": ["0", "1", "2"],
    "HOCA-B": ["0_1", "0_2", "1_2"],
    "HOCA-T": ["0_1_2"],
    "HOCA-UB": ["0", "1", "2", "0_1", "0_2", "1_2"],
    "HOCA-UBT": ["0", "1", "2", "0_1", "0_2", "1_2", "0_1_2"],
}


def _model(variant: str, count: int = 3, seed: int = 0) -> VideoCaptioner:
    torch.manual_seed(seed)
    orders, low_rank = variant_settings(variant)
    return VideoCaptioner([5] * count, 9, orders=orders, low_rank=low_rank, max_lengths=[4] * count, feature_dim=6,
                          embed_dim=4, hidden_dim=8, attention_dim=4, dropout=0.0)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "mean-pool"])
def test_each_variant_builds_the_papers_terms(variant: str) -> None:
    model = _model(variant)
    base = variant.removeprefix("L-")
    assert list(model.decoder.maf.terms) == EXPECTED[base]
    kinds = {type(term).__name__ for key, term in model.decoder.maf.terms.items() if "_" in key}
    if kinds:
        assert kinds == ({"LowRankHOCA"} if variant.startswith("L-") else {"HOCA"})


def test_mean_pool_has_no_attention() -> None:
    assert isinstance(_model("mean-pool").decoder.maf, MeanPoolContext)
    with pytest.raises(ValueError, match="unknown captioning variant 'HOCA-X'"):
        variant_settings("HOCA-X")


@pytest.mark.parametrize(("ternary", "binary"), [("HOCA-T", "HOCA-B"), ("L-HOCA-UBT", "L-HOCA-UB")])
def test_with_two_modalities_ternary_is_the_pair(ternary: str, binary: str) -> None:
    # Two modalities: "all together" is the one pair, so the models are the same, weight for weight.
    first, second = _model(ternary, count=2), _model(binary, count=2)
    assert first.state_dict().keys() == second.state_dict().keys()
    for key, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[key]), key
