"""The captioning figure: one video's frames, its generated and reference captions, and
MAF's attention over time in every modality for each generated word.

``polyfuse plot --captions RUN_DIR --video ID --out FILE.png`` (or ``plot attention
--checkpoint FILE``): the checkpoint generates the caption by beam search (as at test time); the decoder is
then run over that caption (teacher forcing) to record, at the step that emits each
word, the attention of every modality over its steps (HOCA Eq. 19) and the
modality weights beta (Eq. 20). The frames are sampled from the clip
(``CLIPS/<id>.avi``, default: the ``clips`` folder beside the caption file, the
shared MSVD layout) at the centres of equal segments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from polyfuse.nn.beam_search import score_captions
from polyfuse.tasks.captioning.data import CaptioningData

__all__ = ["caption_attention", "plot_caption_attention", "video_of"]


def video_of(data: CaptioningData, split: str, sample: int) -> str:
    """The ``sample``-th video of ``split`` (in the splits file's order)."""
    if split not in data.splits:
        raise ValueError(f"no {split!r} split; have {', '.join(data.splits)}")
    videos = data.splits[split]
    if not 0 <= sample < len(videos):
        raise ValueError(f"sample {sample} outside the {len(videos)} videos of {split!r}")
    return videos[sample]


def caption_attention(task: Any, extras: dict[str, Any], video: str, data: CaptioningData) -> dict[str, Any]:
    """The generated caption of ``video``, its words' attention per modality, and the
    references, by a loaded captioning checkpoint (``task``, ``extras``; ``data``: its
    videos, :func:`polyfuse.tasks.captioning.spec.checkpoint_captioning_data`)."""
    if video not in data.videos:
        raise ValueError(f"video {video!r} is not in the checkpoint's data ({len(data.videos)} videos)")
    rows = torch.tensor([data.row_of(video)])
    inputs, masks = data.gather(rows)
    with torch.no_grad():
        generated = task.generate(inputs, masks)
        _, steps = score_captions(
            task.model.decoder, task.model.encode(inputs, masks), masks, generated.tokens,
            begin_index=task.vocabulary.begin, end_index=task.vocabulary.end, length_penalty=task.length_penalty,
        )
    ids = [int(t) for t in generated.tokens[0] if int(t) != task.vocabulary.pad]
    words = [task.vocabulary.words[i] for i in ids]
    return {
        "video": video,
        "split": next(s for s, vs in data.splits.items() if video in vs),
        "caption": task.vocabulary.decode(ids),
        "words": words,
        "attention": [torch.stack([s.attention[m][0] for s in steps[: len(ids)]]).numpy() for m in range(len(masks))],
        "modality_weights": torch.stack([s.modality_weights[0] for s in steps[: len(ids)]]).numpy(),
        "modalities": data.modalities,
        "references": data.captions[video],
        "frame_stride": extras["config"]["captioning"]["frame_stride"],
        "captions_file": extras["config"]["captioning"]["captions"],
    }


def plot_caption_attention(
    task: Any, extras: dict[str, Any], video: str, out: str | Path, *, clips: str | Path | None = None,
    data: CaptioningData, frames: int = 8, references: int = 3,
) -> Path:
    """Write the figure (see the module docstring; drawn by
    :func:`polyfuse.figures.captioning.draw_caption_attention`) to ``out``."""
    from polyfuse.figures.captioning import draw_caption_attention

    found = caption_attention(task, extras, video, data)
    clips = Path(clips) if clips is not None else Path(found["captions_file"]).parent / "clips"
    clip = clips / f"{video}.avi"
    images = None
    if clip.is_file():
        from polyfuse.extract.video import sample_frames

        images = sample_frames(clip, frames)
    return draw_caption_attention(found, images, out, references=references, frames=frames,
                                  no_frames=f"(no clip at {clip})")
