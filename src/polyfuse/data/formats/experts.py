"""Video expert features and captions for retrieval, from files that never need unpickling.

Shapes: ``N`` videos, ``T`` steps of an expert (padded), ``d`` its feature size.

An *expert* is one kind of video feature (appearance, motion, audio, speech, OCR, face,
scene, ... in collaborative experts, Liu et al. BMVC 2019, the features MAN section 3.3
uses). Each expert is one file, in either of two layouts:

* ``.npz``: ``video_ids`` (N,) strings, ``features`` (N, T, d) or (N, d), and optionally
  ``lengths`` (N,) ints (real steps per video; default all T). Read with
  ``allow_pickle=False``.
* ``.h5`` / ``.hdf5``: a group ``features`` with one dataset per video id, (T_i, d) or
  (d,): the layout of collaborative experts' per-expert pickles (a dict from video id
  to an array) written out as HDF5.

Both are opened with :func:`polyfuse.data.sequences.open_sequences` (``.h5`` stacked
``video_ids`` + ``features`` is read too). Loading reads the ids and lengths, then makes
one pass over the file in chunks of videos (:data:`SCAN_BYTES` at a time) to find which
videos have the expert; nothing of it is kept. The features are read per batch
(:meth:`ExpertFeatures.gather`), in the data loader's collate, so memory does not grow
with the number of videos.

A video absent from an expert's file, or whose array is entirely NaN (how collaborative
experts marks a missing face or speech expert), *lacks* that expert: its ``present``
flag is False and its steps are masked. A partly non-finite array is refused at load.

Collaborative experts ships pickles; this module refuses them (unpickling runs arbitrary
code). Convert one in your own environment, where you trust the file, with this one
line::

    python -c "import pickle,sys,h5py,numpy as np; d=pickle.load(open(sys.argv[1],'rb')); f=h5py.File(sys.argv[2],'w'); [f.create_dataset('features/'+k, data=np.asarray(v,dtype='float32')) for k,v in d.items()]" EXPERT.pkl EXPERT.h5

The MSR-VTT 9k/1k split of collaborative experts is two id lists
(``train_list_jsfusion.txt``, ``val_list_jsfusion.txt``), read by :func:`read_id_list`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from polyfuse.data.formats.jsonfile import read_json
from polyfuse.data.sequences import check_video_ids, open_sequences

__all__ = [
    "PICKLE_CONVERSION",
    "ExpertFeatures",
    "RetrievalCorpus",
    "load_captions",
    "load_expert",
    "read_id_list",
]

PICKLE_CONVERSION = (
    "python -c \"import pickle,sys,h5py,numpy as np; d=pickle.load(open(sys.argv[1],'rb')); "
    "f=h5py.File(sys.argv[2],'w'); [f.create_dataset('features/'+k, "
    "data=np.asarray(v,dtype='float32')) for k,v in d.items()]\" EXPERT.pkl EXPERT.h5"
)


class _TensorRows:
    """Features held in memory (a synthetic corpus, features derived from a file), read in
    rows like a :class:`~polyfuse.data.sequences.SequenceFile`."""

    def __init__(self, features: Tensor, lengths: np.ndarray) -> None:
        self.features, self.lengths = features, lengths
        self.dim = int(features.shape[-1])

    def read(self, rows: Sequence[int]) -> list[np.ndarray]:
        return [self.features[r, : self.lengths[r]].numpy() for r in rows]


class ExpertFeatures:
    """One expert over a list of videos, read a batch at a time (:meth:`gather`).

    It holds, per video, the row of the video in the expert's file (-1 where the file
    lacks the video), its number of real steps and whether it has the expert
    (``present``); the features stay in the file. ``steps`` is the expert's longest
    sequence in its file (the T of the whole-array view).

    ``ExpertFeatures(name, video_ids, features, mask, present)`` makes one from tensors
    held in memory: ``features`` (N, T, d), ``mask`` (N, T) bool, True at a prefix of each
    row's steps, ``present`` (N,) bool."""

    def __init__(self, name: str, video_ids: Sequence[str], features: Tensor, mask: Tensor, present: Tensor) -> None:
        lengths = mask.sum(1)
        if features.ndim != 3 or mask.shape != features.shape[:2] or present.shape != features.shape[:1]:
            raise ValueError(f"expert {name!r}: features (N, T, d), mask (N, T) and present (N,) do not agree")
        if not torch.equal(mask, torch.arange(mask.shape[1]) < lengths.unsqueeze(1)):
            raise ValueError(f"expert {name!r}: the mask must be True at a prefix of each video's steps")
        lengths = lengths.numpy().astype(np.int64)
        self._set(name, video_ids, _TensorRows(features.float(), lengths), np.arange(len(video_ids)), lengths,
                  present.numpy().astype(bool), int(features.shape[1]))

    @classmethod
    def view(cls, name: str, video_ids: Sequence[str], source: Any, rows: np.ndarray, lengths: np.ndarray,
             present: np.ndarray, steps: int) -> ExpertFeatures:
        """The expert over ``video_ids`` whose ``rows`` of ``source`` (a
        :class:`~polyfuse.data.sequences.SequenceFile`; -1: not in it) have ``lengths`` steps."""
        expert = cls.__new__(cls)
        expert._set(name, video_ids, source, rows, lengths, present, steps)
        return expert

    def _set(self, name: str, video_ids: Sequence[str], source: Any, rows: np.ndarray, lengths: np.ndarray,
             present: np.ndarray, steps: int) -> None:
        self.name, self.video_ids, self.source, self.steps = name, list(video_ids), source, int(steps)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.lengths = np.where(present, lengths, 0).astype(np.int64)
        self._present = np.asarray(present, dtype=bool)

    @property
    def present(self) -> Tensor:
        """(N,) bool: the video has the expert."""
        return torch.from_numpy(self._present.copy())

    @property
    def dim(self) -> int:
        return int(self.source.dim)

    def select(self, video_ids: Sequence[str]) -> ExpertFeatures:
        """The same expert over ``video_ids`` (in that order); videos it lacks are absent."""
        index = {v: i for i, v in enumerate(self.video_ids)}
        at = np.array([index.get(v, -1) for v in video_ids], dtype=np.int64)  # -1: the sentinel appended
        rows, lengths = np.append(self.rows, -1)[at], np.append(self.lengths, 0)[at]
        present = np.append(self._present, False)[at]
        return ExpertFeatures.view(self.name, video_ids, self.source, rows, lengths, present, self.steps)

    def gather(self, rows: Sequence[int] | Tensor, steps: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The videos ``rows`` read from the file: ``features`` (B, T_b, d) float32, zero at
        masked steps, ``mask`` (B, T_b) bool, True at real steps, ``present`` (B,) bool.
        ``T_b`` is ``steps`` or else the longest sequence of the batch (at least 1); a
        video that lacks the expert is all zero and masked."""
        rows = np.asarray(rows.tolist() if isinstance(rows, Tensor) else rows, dtype=np.int64).reshape(-1)
        lengths, present = self.lengths[rows], self._present[rows]
        longest = max(1, int(lengths.max(initial=0)))
        width = longest if steps is None else int(steps)
        if width < longest:
            raise ValueError(f"expert {self.name!r}: cannot pad to {width} steps a batch with {longest}")
        features = np.zeros((len(rows), width, self.dim), dtype=np.float32)
        here = np.flatnonzero(present)
        for i, array in zip(here, self.source.read(self.rows[rows[here]].tolist()), strict=True):
            array = np.asarray(array, dtype=np.float32).reshape(-1, self.dim)
            if len(array) != lengths[i]:
                raise ValueError(f"{getattr(self.source, 'where', self.name)}: video {self.video_ids[rows[i]]!r} "
                                 f"has {len(array)} steps in expert {self.name!r}, {lengths[i]} when it was loaded "
                                 "(the file changed?)")
            features[i, : len(array)] = array
        return torch.from_numpy(features), self.step_mask(rows, width), torch.from_numpy(present.copy())

    def step_mask(self, rows: Sequence[int] | Tensor, steps: int | None = None) -> Tensor:
        """(B, steps) bool, True at the real steps of the videos ``rows`` (nothing is read;
        ``steps``: by default the expert's longest sequence)."""
        rows = np.asarray(rows.tolist() if isinstance(rows, Tensor) else rows, dtype=np.int64).reshape(-1)
        return torch.from_numpy(np.arange(self.steps if steps is None else steps) < self.lengths[rows, None])

    @property
    def features(self) -> Tensor:
        """(N, steps, d): every video read at once (small corpora, benchmarks; training reads
        batches with :meth:`gather`)."""
        return self.gather(range(len(self.video_ids)), self.steps)[0]

    @property
    def mask(self) -> Tensor:
        """(N, steps) bool, True at real steps (nothing is read)."""
        return self.step_mask(range(len(self.video_ids)))


#: the bytes of features one chunk of the pass at load reads
SCAN_BYTES = 64 << 20


def _scan(name: str, sequences: Any, where: str) -> np.ndarray:
    """(N,) whether each video of the file has the expert, from one pass over the file in
    chunks of videos: an all-NaN array marks a missing expert (collaborative experts'
    convention), a partly non-finite one is refused."""
    ids, lengths = sequences.ids, np.asarray(sequences.lengths, dtype=np.int64)
    present = np.zeros(len(ids), dtype=bool)
    chunk = max(1, SCAN_BYTES // (4 * max(1, int(lengths.max(initial=1))) * max(1, int(sequences.dim))))
    for start in range(0, len(ids), chunk):
        rows = range(start, min(start + chunk, len(ids)))
        for row, array in zip(rows, sequences.read(list(rows)), strict=True):
            finite = np.isfinite(array)
            if not finite.any():
                continue  # missing expert (collaborative experts' NaN convention)
            if not finite.all():
                raise ValueError(f"{where}: video {ids[row]!r} has some non-finite values in expert {name!r}")
            present[row] = True
    return present


def load_expert(path: str | Path, name: str | None = None) -> ExpertFeatures:
    """Open one expert file (``.npz`` or ``.h5``/``.hdf5``, layouts in the module doc):
    its ids and lengths, and which videos have the expert (one pass over the file, which
    refuses a partly non-finite array); the features are read per batch."""
    path = Path(path)
    name = name or path.stem
    suffix = path.suffix.lower()
    if suffix in (".pkl", ".pickle", ".p"):
        raise ValueError(
            f"{path}: pickled features are not read (unpickling runs code). Convert the file "
            f"once, where you trust it:\n  {PICKLE_CONVERSION}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"expert file {path} does not exist")
    if suffix not in (".npz", ".h5", ".hdf5"):
        raise ValueError(f"{path}: unknown expert file type {suffix!r}; expected .npz, .h5 or .hdf5")
    sequences = open_sequences(path, key="features")
    ids = list(sequences.ids)  # checked by open_sequences
    lengths = np.asarray(sequences.lengths, dtype=np.int64)
    present = _scan(name, sequences, str(path))
    steps = max(1, int(lengths.max(initial=1)))
    return ExpertFeatures.view(name, ids, sequences, np.arange(len(ids)), lengths, present, steps)


def read_id_list(path: str | Path) -> list[str]:
    """Video ids, one per line (blank lines skipped), e.g. the MSR-VTT 9k/1k lists."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"id list {path} does not exist")
    ids = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return check_video_ids(ids, str(path))


def load_captions(path: str | Path) -> dict[str, list[str]]:
    """``{video_id: [caption, ...]}`` from a JSON file, checked (no empty caption or id)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"captions file {path} does not exist")
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object {{video_id: [caption, ...]}}")
    for video, captions in data.items():
        if not video or not isinstance(captions, list) or not captions:
            raise ValueError(f"{path}: video {video!r} has no caption list")
        for i, caption in enumerate(captions):
            if not isinstance(caption, str) or not caption.strip():
                raise ValueError(f"{path}: caption {i} of video {video!r} is empty")
    return data


@dataclass
class RetrievalCorpus:
    """Videos with their experts and captions, aligned and checked.

    ``experts`` map a name to :class:`ExpertFeatures` over ``video_ids`` (same order);
    ``captions`` is a flat list with ``caption_video`` the video id of each caption.
    """

    video_ids: list[str]
    experts: dict[str, ExpertFeatures]
    captions: list[str]
    caption_video: list[str]

    @classmethod
    def build(
        cls,
        experts: Mapping[str, ExpertFeatures],
        captions: Mapping[str, Sequence[str]],
        video_ids: Sequence[str],
    ) -> RetrievalCorpus:
        """Align ``experts`` and ``captions`` on ``video_ids``.

        Raises (naming the id) when a video has no caption, or when it has no feature in
        any expert (a caption whose video has no features).
        """
        video_ids = check_video_ids(list(video_ids), "video ids")
        if not experts:
            raise ValueError("at least one expert is needed")
        for video in video_ids:
            if video not in captions:
                raise ValueError(f"video {video!r} has no captions")
        selected = {name: expert.select(video_ids) for name, expert in experts.items()}
        any_present = torch.stack([e.present for e in selected.values()]).any(dim=0)
        for video, has in zip(video_ids, any_present.tolist(), strict=True):
            if not has:
                raise ValueError(f"video {video!r} has captions but no features in any expert")
        texts, owners = [], []
        for video in video_ids:
            texts.extend(captions[video])
            owners.extend([video] * len(captions[video]))
        return cls(video_ids, selected, texts, owners)

    def subset(self, video_ids: Sequence[str]) -> RetrievalCorpus:
        keep = set(video_ids)
        missing = [v for v in video_ids if v not in set(self.video_ids)]
        if missing:
            raise ValueError(f"video {missing[0]!r} is not in the corpus")
        chosen = [i for i, c in enumerate(self.caption_video) if c in keep]
        return RetrievalCorpus(
            list(video_ids),
            {n: e.select(video_ids) for n, e in self.experts.items()},
            [self.captions[i] for i in chosen],
            [self.caption_video[i] for i in chosen],
        )
