"""model.options.{tfn,lmf}.sequence_modalities: modality names become the fusion
inputs' indices (through the input groups when there are some)."""

import pytest

from polyfuse.engine import resolve_config
from polyfuse.nn.modality_subnetworks import SequenceSubnetwork
from polyfuse.tasks.building import build_backbone

NAMES = ["m0", "m1", "m2"]


def lstm_inputs(backbone):
    return [j for j, net in enumerate(backbone.fusion.subnetworks) if isinstance(net, SequenceSubnetwork)]


@pytest.mark.parametrize(
    ("fusion", "given", "groups", "expected"),
    [
        ("tfn", ["m2"], {}, [2]),
        ("lmf", ["m1", "m0"], {}, [1, 0]),
        ("lmf", [1], {}, [1]),
        ("lmf", ["m2"], {"lmf": [["m0"], ["m1", "m2"]]}, [1]),
    ],
)
def test_names_become_input_indices(tiny_config, fusion, given, groups, expected):
    options = {"hidden_dims": 2, "lstm_dim": 2, "sequence_modalities": given}
    config = resolve_config(tiny_config(
        model={"fusion": fusion, "options": {fusion: options}, "input_groups": groups}
    ))
    backbone = build_backbone(config, [4, 3, 5], NAMES)
    assert sorted(lstm_inputs(backbone)) == sorted(expected)


def test_an_unknown_name_is_refused(tiny_config):
    config = resolve_config(tiny_config(
        model={"fusion": "tfn", "options": {"tfn": {"sequence_modalities": ["text"]}}}
    ))
    with pytest.raises(
        ValueError,
        match=r"model.options.tfn.sequence_modalities names 'text', not one of the modalities \['m0', 'm1', 'm2'\]",
    ):
        build_backbone(config, [4, 3, 5], NAMES)
