"""What the retrieval task types (``retrieval``, ``chimera``) share above the data floor:
optimizer parameter groups (a fine-tuned text encoder at its own rate, some parameters
moved to a group of their own) and the writer of their per-caption prediction records."""

from __future__ import annotations

import torch

__all__ = ["fine_tuned_parameters", "own_group", "parameter_groups", "write_rank_records"]


def fine_tuned_parameters(encoder) -> list[torch.nn.Parameter]:
    """The parameters of a text encoder that ``text_lr`` trains (an error if it has none)."""
    parameters = [p for p in getattr(encoder, "parameters", lambda: [])() if p.requires_grad]
    if not parameters:
        raise ValueError(f"the text encoder {type(encoder).__name__} has nothing to fine-tune "
                         "(bag of words, or built frozen); drop text_lr")
    return parameters


def parameter_groups(model: torch.nn.Module, encoder, text_lr: float | None) -> list[dict]:
    """The optimizer's parameter groups: the model's, and the text encoder's at ``text_lr``
    when it is fine-tuned (``text_lr`` not None)."""
    groups = [{"params": list(model.parameters())}]
    if text_lr is not None:
        if encoder is None:
            raise ValueError("text_lr is set but no text encoder was given to fine-tune")
        groups.append({"params": fine_tuned_parameters(encoder), "lr": text_lr})
    return groups


def own_group(groups: list[dict], params, **options) -> list[dict]:
    """``groups`` with ``params`` moved from the first group (the model's) into a group of
    their own with ``options`` (``lr``, ``weight_decay``), placed last."""
    params = list(params)
    ids = {id(p) for p in params}
    rest = [p for p in groups[0]["params"] if id(p) not in ids]
    return [{**groups[0], "params": rest}, *groups[1:], {"params": params, **options}]


def write_rank_records(records, path) -> None:
    """Per-caption ranking records (caption, video_id, rank, top5) as CSV, written atomically."""
    import csv
    import io
    from pathlib import Path

    from polyfuse.atomic import atomic_write_text

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["caption", "video_id", "rank", "top5"])
    writer.writeheader()
    writer.writerows(records)
    atomic_write_text(Path(path), buffer.getvalue())
