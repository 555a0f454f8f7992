"""Whole models: what a task of :mod:`polyfuse.tasks` trains, built from the modules of
:mod:`polyfuse.nn` (the backbones a task's head sits on are in :mod:`polyfuse.nn.backbones`).

- :mod:`~polyfuse.nn.models.vqa`: :class:`BanVQA` (BAN with ban-vqa's counter) and
  :class:`FusionVQA` (any fusion between the same question encoder and classifier);
- :mod:`~polyfuse.nn.models.captioner`: :class:`VideoCaptioner` (HOCA section 4.4);
- :mod:`~polyfuse.nn.models.retrieval`: :class:`RetrievalModel`, text-video retrieval
  over experts (MAN section 3.3, collaborative experts);
- :mod:`~polyfuse.nn.models.chimera`: :class:`ChimeraRetrievalModel` (Chimera section 3).
"""

from polyfuse.nn.models.captioner import VideoCaptioner
from polyfuse.nn.models.chimera import ChimeraRetrievalModel, ChimeraSides
from polyfuse.nn.models.retrieval import RetrievalModel
from polyfuse.nn.models.vqa import BanVQA, FusionVQA

__all__ = [
    "BanVQA",
    "ChimeraRetrievalModel",
    "ChimeraSides",
    "FusionVQA",
    "RetrievalModel",
    "VideoCaptioner",
]
