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

A video absent from an expert's file, or whose array is entirely NaN (how collaborative
experts marks a missing face or speech expert), *lacks* that expert: its ``present``
flag is False and its steps are masked. Collaborative experts ships pickles; this
module refuses them (unpickling runs arbitrary code). Convert one in your own
environment, where you trust the file, with this one line::

    python -c "import pickle,sys,h5py,numpy as np; d=pickle.load(open(sys.argv[1],'rb')); f=h5py.File(sys.argv[2],'w'); [f.create_dataset('features/'+k, data=np.asarray(v,dtype='float32')) for k,v in d.items()]" EXPERT.pkl EXPERT.h5

The MSR-VTT 9k/1k split of collaborative experts is two id lists
(``train_list_jsfusion.txt``, ``val_list_jsfusion.txt``), read by :func:`read_id_list`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from polyfuse.data.arrays import NpzArrays, open_h5
from polyfuse.data.formats.jsonfile import read_json

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


@dataclass
class ExpertFeatures:
    """One expert over a list of videos: ``features`` (N, T, d) float32 (zero at masked
    steps), ``mask`` (N, T) bool (True at real steps), ``present`` (N,) bool."""

    name: str
    video_ids: list[str]
    features: Tensor
    mask: Tensor
    present: Tensor

    @property
    def dim(self) -> int:
        return int(self.features.shape[-1])

    def select(self, video_ids: Sequence[str]) -> ExpertFeatures:
        """The same expert over ``video_ids`` (in that order); videos it lacks are absent."""
        index = {v: i for i, v in enumerate(self.video_ids)}
        n, (t, d) = len(video_ids), self.features.shape[1:]
        features = torch.zeros(n, t, d)
        mask = torch.zeros(n, t, dtype=torch.bool)
        present = torch.zeros(n, dtype=torch.bool)
        for row, video in enumerate(video_ids):
            if video in index:
                i = index[video]
                features[row], mask[row], present[row] = self.features[i], self.mask[i], self.present[i]
        return ExpertFeatures(self.name, list(video_ids), features, mask, present)


def _check_ids(ids: Sequence[str], where: str) -> list[str]:
    seen: set[str] = set()
    for video in ids:
        if not video:
            raise ValueError(f"{where}: an empty video id")
        if video in seen:
            raise ValueError(f"{where}: duplicate video id {video!r}")
        seen.add(video)
    return list(ids)


def _from_rows(name: str, ids: list[str], rows: list[np.ndarray], where: str) -> ExpertFeatures:
    """Pad per-video (T_i, d) arrays; all-NaN arrays mark a missing expert."""
    dims = {}
    for video, row in zip(ids, rows, strict=True):
        if row.ndim not in (1, 2) or row.size == 0:
            raise ValueError(f"{where}: video {video!r} has an array of shape {row.shape}")
        dims.setdefault(row.shape[-1], video)
    if len(dims) > 1:
        (d0, v0), (d1, v1) = list(dims.items())[:2]
        raise ValueError(
            f"{where}: expert {name!r} has feature size {d0} for video {v0!r} but {d1} for video {v1!r}"
        )
    rows = [r[None, :] if r.ndim == 1 else r for r in rows]
    steps = max(r.shape[0] for r in rows)
    features = torch.zeros(len(rows), steps, rows[0].shape[-1])
    mask = torch.zeros(len(rows), steps, dtype=torch.bool)
    present = torch.zeros(len(rows), dtype=torch.bool)
    for i, (video, row) in enumerate(zip(ids, rows, strict=True)):
        finite = np.isfinite(row)
        if not finite.any():
            continue  # missing expert (collaborative experts' NaN convention)
        if not finite.all():
            raise ValueError(f"{where}: video {video!r} has some non-finite values in expert {name!r}")
        features[i, : row.shape[0]] = torch.from_numpy(np.asarray(row, dtype=np.float32))
        mask[i, : row.shape[0]] = True
        present[i] = True
    return ExpertFeatures(name, ids, features, mask, present)


def load_expert(path: str | Path, name: str | None = None) -> ExpertFeatures:
    """Read one expert file (``.npz`` or ``.h5``/``.hdf5``, layouts in the module doc)."""
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
    if suffix == ".npz":
        data = NpzArrays(path)  # each array's size checked from its header before it is read
        for key in ("video_ids", "features"):
            if key not in data:
                raise ValueError(f"{path}: missing array {key!r} (has {sorted(data)})")
        ids = _check_ids([str(v) for v in data["video_ids"]], str(path))
        features = data["features"]
        if features.ndim == 2:
            features = features[:, None, :]
        if features.ndim != 3 or features.shape[0] != len(ids):
            raise ValueError(
                f"{path}: features has shape {features.shape}, expected ({len(ids)}, T, d) or ({len(ids)}, d)"
            )
        lengths = data["lengths"] if "lengths" in data else np.full(len(ids), features.shape[1])
        if lengths.shape != (len(ids),) or (lengths < 1).any() or (lengths > features.shape[1]).any():
            raise ValueError(f"{path}: lengths must be (N,) ints in [1, {features.shape[1]}]")
        rows = [features[i, : int(n)] for i, n in enumerate(lengths)]
        return _from_rows(name, ids, rows, str(path))
    if suffix in (".h5", ".hdf5"):
        with open_h5(path) as handle:  # no external storage or links, sizes bounded
            if "features" not in handle:
                raise ValueError(f"{path}: no group 'features' (one dataset per video id)")
            group = handle["features"]
            ids = _check_ids(sorted(group.keys()), str(path))
            rows = [np.asarray(group[v][()], dtype=np.float64) for v in ids]
        return _from_rows(name, ids, rows, str(path))
    raise ValueError(f"{path}: unknown expert file type {suffix!r}; expected .npz, .h5 or .hdf5")


def read_id_list(path: str | Path) -> list[str]:
    """Video ids, one per line (blank lines skipped), e.g. the MSR-VTT 9k/1k lists."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"id list {path} does not exist")
    ids = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return _check_ids(ids, str(path))


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
        video_ids = _check_ids(list(video_ids), "video ids")
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
