"""Moved to :mod:`polyfuse.nn.models.vqa`; kept for 0.3.x (the README named ``polyfuse.nn.vqa.BanVQA``)."""

from polyfuse.nn.models.vqa import BanVQA, FusionVQA, answer_classifier, build_vqa_model, image_mask

__all__ = ["BanVQA", "FusionVQA", "answer_classifier", "build_vqa_model", "image_mask"]
