"""Evaluation metrics: update/compute classes and their functional twins."""

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
