"""Changed defaults, and the message an old configuration or checkpoint gets about them.

A run records the polyfuse version that trained it (``polyfuse_version`` in its
``config.yaml`` and in every checkpoint's configuration); a configuration file may
state the version it was written for the same way. :data:`DEFAULT_CHANGES` lists the
defaults a configuration can see change, each with the version that changed it.
:func:`default_change_warnings` gives one message per change that a configuration
recorded before that version relies on (it uses the module and leaves the key to
the default); :func:`warn_default_changes` logs them as warnings (the run log).
A change marked ``layout`` changes the weights a configuration builds:
:func:`defaults_then` sets such a key back to its old value for a saved run or
checkpoint that relies on it, so that its weights still load. A
saved run or checkpoint without ``polyfuse_version`` predates the record and counts
as version 0.1.0; a configuration file without it is taken as written for this
version (nothing to say). CHANGELOG.md lists every change, these included.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from polyfuse import __version__
from polyfuse.tasks.registry import available_tasks, task_spec

__all__ = [
    "DEFAULT_CHANGES",
    "UNRECORDED_VERSION",
    "DefaultChange",
    "default_change_warnings",
    "defaults_then",
    "parse_version",
    "warn_default_changes",
]

log = logging.getLogger(__name__)

#: the version of a saved run or checkpoint that records none (before the record existed)
UNRECORDED_VERSION = "0.1.0"


@dataclass(frozen=True)
class DefaultChange:
    """The default of ``key`` (a dotted configuration path) became ``new`` in ``version``;
    ``uses(config)`` says whether a configuration builds what the key configures."""

    version: str
    key: str
    old: Any
    new: Any
    uses: Callable[[Mapping[str, Any]], bool]
    what: str
    layout: bool = False  #: the weights' layout changed: old checkpoints load with the old value


def _fusion_is(name: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda config: (config.get("model") or {}).get("fusion", "man") == name


def _owns(section: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a configuration's task type owns ``section`` (its spec's ``sections``)."""

    def owns(config: Mapping[str, Any]) -> bool:
        name = (config.get("task") or {}).get("type", "sentiment")
        return name in available_tasks() and section in task_spec(name).sections

    return owns


_vqa = _owns("data.vqa")
_captioning = _owns("decoder")


def _captioning_with_encoder(config: Mapping[str, Any]) -> bool:
    return _captioning(config) and (config.get("decoder") or {}).get("feature_dim", 128) is not None


def _lstm_lmf_without_text_first(config: Mapping[str, Any]) -> bool:
    model, data = config.get("model") or {}, config.get("data") or {}
    names = data.get("modalities") or []
    return model.get("backbone") == "lstm_lmf" and bool(names) and names[0] != "text"


DEFAULT_CHANGES: tuple[DefaultChange, ...] = (
    DefaultChange(
        "0.2.0", "model.options.tfn.subnetworks", "light", "paper", _fusion_is("tfn"),
        "TFN's modality subnetworks are the paper's (an LSTM for the text-like modalities, "
        "3-layer networks for the others, a two-layer inference network), not a linear map per modality",
    ),
    DefaultChange(
        "0.2.0", "model.options.lmf.subnetworks", "light", "paper", _fusion_is("lmf"),
        "LMF's modality subnetworks are the paper's (an LSTM for the text-like modalities, "
        "3-layer networks for the others); on CMU-MOSI an LMF row moved by 0.014 MAE",
    ),
    DefaultChange(
        "0.2.0", "model.options.man.estimator", "arf", "gerf", _fusion_is("man"),
        "MAN's had mode draws centred generalised random features (gerf) instead of the paper's "
        "addition random features (arf)",
    ),
    DefaultChange(
        "0.2.0", "model.options.man.stacking", "shared", "per_modality", _fusion_is("man"),
        "MAN's stacked layers give each modality its own pass against the others' original "
        "sequences (Eq. 13) instead of one shared pass",
    ),
    DefaultChange(
        "0.2.0", "model.options.man.mode", "had", "auto", _fusion_is("man"),
        "MAN computes exact attention while heads x prod_j T_j <= exact_limit (2^16 tuples per sample) "
        "and had beyond, per call, instead of had always",
    ),
    DefaultChange(
        "0.2.0", "model.options.man.exact_lsc", False, True, _fusion_is("man"),
        "MAN's had mode computes the LSC part of the logits exactly over the chunk tuples and "
        "estimates only the learned features (lower error; more work per call)",
    ),
    DefaultChange(
        "0.2.0", "model.options.lstm_lmf.text", 0, "the modality named text", _lstm_lmf_without_text_first,
        "the LSTM + LMF backbone's LSTM reads the modality named text (refused without one) "
        "instead of the first modality",
    ),
    DefaultChange(
        "0.3.0", "decoder.encoder", "linear", "bilstm", _captioning_with_encoder,
        "the captioning model encodes each modality with the paper's bidirectional LSTM (HOCA section 3.1; "
        "both directions concatenated, 2 x feature_dim features) instead of tanh(linear)",
        layout=True,
    ),
    DefaultChange(
        "0.3.0", "captioning.allow_unknown", True, False, _captioning,
        "beam search never generates <unk>",
    ),
    DefaultChange(
        "0.3.0", "captioning.min_count", 2, 1, _captioning,
        "the caption vocabulary holds every training-caption word, as the paper's (HOCA section 5.2)",
    ),
    DefaultChange(
        "0.3.0", "data.vqa.answer_count", "all_answers", "multiple_choice", _vqa,
        "the VQA answer vocabulary counts each training question once, for its multiple-choice answer "
        "(the paper's and ban-vqa's rule), instead of every human answer (ten per question)",
    ),
    DefaultChange(
        "0.3.0", "data.vqa.min_word_count", 1, 2, _vqa,
        "VQA question words seen once in training share the <unk> row with the words outside the "
        "vocabulary (which were padding before), so that row is trained",
    ),
    DefaultChange(
        "0.3.0", "data.vqa.soft_score", "min_third", "ban_vqa", _vqa,
        "VQA training targets are ban-vqa's 0.3 / 0.6 / 0.9 / 1 for answers of 1 / 2 / 3 / 4+ humans "
        "instead of min(n / 3, 1)",
    ),
)


def parse_version(text: Any) -> tuple[int, ...]:
    """``"0.2.0"`` -> (0, 2, 0); anything after a ``+`` or a non-digit tail of a part is ignored."""
    parts = []
    for part in str(text).split("+")[0].split("."):
        digits = ""
        for character in part:
            if not character.isdigit():
                break
            digits += character
        if not digits:
            raise ValueError(f"polyfuse_version {text!r} is not a version such as {__version__}")
        parts.append(int(digits))
    return tuple(parts)


def _is_set(config: Mapping[str, Any], key: str) -> bool:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def default_change_warnings(
    config: Mapping[str, Any], *, origin: str, recorded: Any = None, saved: bool = True
) -> list[str]:
    """One message per default changed after the version ``config`` was recorded with that it
    relies on (uses the module, leaves the key unset).

    ``recorded``: the version (default: ``config["polyfuse_version"]``); none recorded
    counts as :data:`UNRECORDED_VERSION` for a saved run or checkpoint (``saved``), and
    as this version for a configuration file (no message).
    """
    recorded_text, changes = _relied_on(config, recorded, saved)
    messages = []
    for change in changes:
        messages.append(
            f"{origin} ({recorded_text}) relies on the default of {change.key}, which changed in "
            f"{change.version} from {change.old!r} to {change.new!r}: {change.what}; set "
            f"{change.key}: {change.old} to build what it built then (see CHANGELOG.md)"
        )
    return messages


def _relied_on(config: Mapping[str, Any], recorded: Any, saved: bool) -> tuple[str, list[DefaultChange]]:
    """(how the recorded version reads, the changes ``config`` relies on)."""
    recorded = recorded if recorded is not None else config.get("polyfuse_version")
    if recorded is None:
        if not saved:
            return "", []
        recorded_text, recorded = f"no polyfuse version recorded (before {_first_change()})", UNRECORDED_VERSION
    else:
        recorded_text = f"polyfuse {recorded}"
    then = parse_version(recorded)
    return recorded_text, [
        change for change in DEFAULT_CHANGES
        if parse_version(change.version) > then and not _is_set(config, change.key) and change.uses(config)
    ]


def defaults_then(config: Mapping[str, Any], *, recorded: Any = None) -> dict[str, Any]:
    """A saved run's or checkpoint's configuration (as saved, before defaults are filled in)
    with every ``layout`` change it relies on set back to the old value: the model its
    weights belong to. No version recorded counts as :data:`UNRECORDED_VERSION`."""
    result = copy.deepcopy(dict(config))
    for change in _relied_on(config, recorded, True)[1]:
        if not change.layout:
            continue
        *sections, last = change.key.split(".")
        node = result
        for part in sections:
            node = node.setdefault(part, {})
        node[last] = change.old
    return result


def _first_change() -> str:
    return min((change.version for change in DEFAULT_CHANGES), key=parse_version)


def warn_default_changes(config: Mapping[str, Any], *, origin: str, saved: bool = True) -> list[str]:
    """Log :func:`default_change_warnings` as warnings; returns them."""
    messages = default_change_warnings(config, origin=origin, saved=saved)
    for message in messages:
        log.warning("%s", message)
    return messages
