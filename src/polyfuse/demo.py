"""The demo: fusion methods side by side on a planted three-way interaction.

``polyfuse demo`` (and ``make demo``) generates the task of
:mod:`polyfuse.data.synthetic` with a fixed seed, trains every method below on the
same training split with the same optimiser and budget, and prints one table:
accuracy on a held-out test split, number of parameters, seconds per epoch. The
test split is only read after training, once per model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from polyfuse.data.synthetic import PlantedInteraction, planted_interaction
from polyfuse.nn.registry import create

__all__ = ["DEMO_MODELS", "MAN_OPTIONS", "DemoModel", "DemoResult", "format_table", "run_demo", "test_accuracy", "train_and_test"]


@dataclass(frozen=True)
class DemoModel:
    label: str
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    modalities: tuple[int, ...] | None = None  # None: all modalities


# The sizes of the demo's MAN (bench/choices.py builds its variants from them).
# LSC with 4 chunks matches the 4 chunks in which the generator places its events.
MAN_OPTIONS = {"hidden_dim": 32, "heads": 4, "chunks": 4, "lsc_scale": 2.0}
DEMO_MODELS = (
    DemoModel("MAN (had)", "man", {**MAN_OPTIONS, "mode": "had", "num_random_features": 64}),
    DemoModel("MAN (exact)", "man", {**MAN_OPTIONS, "mode": "exact"}),
    # auto: exact at this size (4 heads x 8 x 10 x 12 = 3,840 tuples per sample <= 2^16)
    DemoModel("MAN (auto)", "man", {**MAN_OPTIONS, "mode": "auto", "num_random_features": 64}),
    DemoModel("BAN (modalities 0, 1)", "ban", {"glimpses": 2}, modalities=(0, 1)),
    DemoModel("Concat", "concat"),
    # The fusion layers alone (one Linear+ReLU per modality over its mean): every model
    # here reads the raw planted features. The papers' subnetworks (the defaults: an
    # LSTM over the first modality, 18M weights in TFN's inference network) are sized
    # for CMU-MOSI and would make this demo take minutes.
    DemoModel("TFN (light)", "tfn", {"subnetworks": "light"}),
    DemoModel("LMF (light)", "lmf", {"subnetworks": "light"}),
)


@dataclass
class DemoResult:
    label: str
    test_accuracy: float
    parameters: int
    seconds_per_epoch: float
    # the trained classifier and the test split, kept when asked (keep_model=True)
    model: nn.Module | None = None
    test: PlantedInteraction | None = None


class FusionClassifier(nn.Module):
    """A fusion module followed by a linear head giving one logit."""

    def __init__(self, fusion: nn.Module, fused_dim: int) -> None:
        super().__init__()
        self.fusion = fusion
        self.head = nn.Linear(fused_dim, 1)

    def forward(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        return self.head(self.fusion(inputs, masks)).squeeze(-1)


def _select(data: PlantedInteraction, modalities: tuple[int, ...] | None, index: Tensor | slice):
    chosen = range(len(data.inputs)) if modalities is None else modalities
    return [data.inputs[j][index] for j in chosen], [data.masks[j][index] for j in chosen]


def train_and_test(
    spec: DemoModel,
    train: PlantedInteraction,
    test: PlantedInteraction,
    *,
    epochs: int,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    fused_dim: int = 32,
    seed: int = 0,
    progress: bool = True,
    keep_model: bool = False,
) -> DemoResult:
    """Train one fusion method with Adam and binary cross-entropy; report test accuracy."""
    torch.manual_seed(seed)
    inputs, _ = _select(train, spec.modalities, slice(None))
    fusion = create(spec.name, input_dims=[x.shape[-1] for x in inputs], out_dim=fused_dim, **spec.kwargs)
    model = FusionClassifier(fusion, fused_dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    targets = (train.labels > 0).float()
    shuffle = torch.Generator().manual_seed(seed)
    steps = epochs * -(-len(train) // batch_size)
    bar = tqdm(total=steps, desc=f"{spec.label:<22}", disable=not progress, leave=True)
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(train), generator=shuffle)
        for first in range(0, len(train), batch_size):
            index = order[first : first + batch_size]
            batch_inputs, batch_masks = _select(train, spec.modalities, index)
            loss = nn.functional.binary_cross_entropy_with_logits(
                model(batch_inputs, batch_masks), targets[index]
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds_per_epoch = (time.perf_counter() - start) / epochs
    bar.close()
    accuracy = test_accuracy(model, test, spec.modalities)
    parameters = sum(p.numel() for p in model.parameters())
    kept = (model, test) if keep_model else (None, None)
    return DemoResult(spec.label, accuracy, parameters, seconds_per_epoch, *kept)


def test_accuracy(model: nn.Module, test: PlantedInteraction, modalities: tuple[int, ...] | None = None) -> float:
    """Accuracy of the classifier's sign on the test split (evaluation mode, no gradients)."""
    model.eval()
    with torch.no_grad():
        logits = model(*_select(test, modalities, slice(None)))
    return ((logits > 0) == (test.labels > 0)).float().mean().item()


def run_demo(
    *,
    num_samples: int = 3000,
    test_fraction: float = 0.2,
    epochs: int = 12,
    seed: int = 0,
    models: tuple[DemoModel, ...] = DEMO_MODELS,
    progress: bool = True,
    keep_models: bool = False,
) -> list[DemoResult]:
    """Generate the planted-interaction task and train every model on it."""
    data = planted_interaction(
        num_samples, lengths=(8, 10, 12), feature_dims=(16, 12, 8), chunks=4, distractors=1,
        signal=3.0, seed=seed,
    )
    split = round(num_samples * (1 - test_fraction))
    train, test = data.subset(slice(0, split)), data.subset(slice(split, None))
    return [
        train_and_test(spec, train, test, epochs=epochs, seed=seed, progress=progress, keep_model=keep_models)
        for spec in models
    ]


def format_table(results: list[DemoResult]) -> str:
    """A Markdown table of the results."""
    lines = [
        "| model | test accuracy | parameters | seconds / epoch |",
        "|---|---:|---:|---:|",
    ]
    for result in results:
        lines.append(
            f"| {result.label} | {100 * result.test_accuracy:.1f}% | {result.parameters:,} "
            f"| {result.seconds_per_epoch:.2f} |"
        )
    return "\n".join(lines)
