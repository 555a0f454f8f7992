"""Evaluation metrics: torchmetrics ``Metric`` classes and their functional twins.

| task | Metric | functional twin |
|---|---|---|
| sentiment (MOSI) | :class:`SentimentMetrics` | :func:`sentiment_metrics` |
| traits (POM) | :class:`TraitMetrics` | :func:`trait_metrics` |
| classification | :class:`ClassificationMetrics` | :func:`classification_metrics` |
| VQA | :class:`~polyfuse.metrics.vqa.VQAScore` | :func:`~polyfuse.metrics.vqa.vqa_accuracy` |
| captioning | :class:`~polyfuse.metrics.captioning.CaptionMetrics` | :func:`~polyfuse.metrics.captioning.caption_metrics` |
| retrieval | :class:`~polyfuse.metrics.retrieval.TextVideoRetrieval` | :func:`~polyfuse.metrics.retrieval.text_video_retrieval` |
| grounding | :class:`~polyfuse.metrics.grounding.GroundingRecall` | :func:`~polyfuse.metrics.grounding.grounding_recall` |

The VQA, captioning, retrieval and grounding metrics live in their modules (``polyfuse.metrics.vqa``
...), imported on use.
"""

from polyfuse.metrics.classes import (
    ClassificationMetrics,
    SentimentMetrics,
    TraitMetrics,
    metric_values,
)
from polyfuse.metrics.functional import (
    SENTIMENT_METRICS,
    classification_metrics,
    round_to_classes,
    sentiment_metrics,
    trait_metrics,
)

__all__ = [
    "SENTIMENT_METRICS",
    "ClassificationMetrics",
    "SentimentMetrics",
    "TraitMetrics",
    "classification_metrics",
    "metric_values",
    "round_to_classes",
    "sentiment_metrics",
    "trait_metrics",
]
