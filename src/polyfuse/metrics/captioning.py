"""Caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr-D through pycocoevalcap.

The captions are tokenised as the MS COCO caption evaluation does: Stanford's
PTBTokenizer (Java, shipped with pycocoevalcap), lower-cased, punctuation dropped.
Without Java the PTB tokenisation falls back to its Python twin
:func:`polyfuse.text.ptb_tokenize` and METEOR (a Java program) is
not scored: its value is None and ``errors["METEOR"]`` says why; the other metrics
are scored all the same. pycocoevalcap's ``Cider`` is CIDEr-D (clipped n-gram
counts, Gaussian length penalty, sigma 6, times 10), with document frequencies
from the references scored. A generated caption that tokenises to nothing (empty, or
punctuation only) is scored as it is, as pycocoevalcap called directly scores it: no
n-gram matches, and length 0 in BLEU's brevity penalty.

:class:`CaptionMetrics` is the torchmetrics ``Metric`` of :func:`caption_metrics`: it
collects each video's generated caption and references over batches and scores them
all at ``compute()`` (corpus-level metrics: document frequencies and BLEU's counts are
taken over the whole split, not averaged over batches).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from polyfuse.text import ptb_tokenize

__all__ = ["CAPTION_METRICS", "CaptionMetrics", "caption_metrics", "java_available"]

CAPTION_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")


def java_available() -> bool:
    return shutil.which("java") is not None


def _check(references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str]) -> None:
    if not hypotheses:
        raise ValueError("caption metrics: no generated captions to score")
    missing = [video for video in hypotheses if video not in references]
    if missing:
        raise ValueError(f"caption metrics: no reference captions for video {missing[0]!r} ({len(missing)} such videos)")
    for video in hypotheses:
        refs = references[video]
        if isinstance(refs, str) or not refs or not all(isinstance(r, str) for r in refs):
            raise ValueError(f"caption metrics: video {video!r} needs a non-empty list of reference captions")
        if not isinstance(hypotheses[video], str):
            raise ValueError(f"caption metrics: the generated caption of video {video!r} is not a string")


def _java_ptb_tokenize(captions: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """pycocoevalcap's ``PTBTokenizer().tokenize`` of ``{video: [caption, ...]}``, run as it
    runs it (Stanford's PTBTokenizer of its jar, ``-preserveLines -lowerCase``, then its
    PUNCTUATIONS dropped), but with Java's stderr read here: the tokenizer's report of
    each call ("PTBTokenizer tokenized 3257 tokens at ... tokens per second.") is not
    printed, anything else Java says is a warning, and a failure an error. The captions'
    file is a temporary one, not one beside the jar (site-packages may be read-only)."""
    import pycocoevalcap.tokenizer.ptbtokenizer as ptb

    jar = Path(ptb.__file__).with_name(ptb.STANFORD_CORENLP_3_4_1_JAR)
    videos = [video for video, texts in captions.items() for _ in texts]
    sentences = "\n".join(text.replace("\n", " ") for texts in captions.values() for text in texts)
    with tempfile.TemporaryDirectory(prefix="polyfuse-ptb-") as folder:
        path = Path(folder) / "captions.txt"
        path.write_bytes(sentences.encode())
        command = ["java", "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines", "-lowerCase",
                   str(path)]  # fmt: skip
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    said = [line.strip() for line in done.stderr.decode(errors="replace").splitlines()
            if line.strip() and not line.startswith("PTBTokenizer tokenized ")]  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the PTB tokenizer (java) failed with exit code {done.returncode}: {' '.join(said)[-500:]}")
    for line in said:
        warnings.warn(f"the PTB tokenizer (java) said: {line}", RuntimeWarning, stacklevel=3)
    tokenized: dict[str, list[str]] = {}
    for video, line in zip(videos, done.stdout.decode().split("\n"), strict=False):  # as pycocoevalcap pairs them
        tokenized.setdefault(video, []).append(" ".join(w for w in line.rstrip().split(" ") if w not in ptb.PUNCTUATIONS))
    return tokenized


def _tokenize(references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str], java: bool) -> tuple[dict, dict]:
    ids = list(hypotheses)
    if java:
        gts = _java_ptb_tokenize({v: list(references[v]) for v in ids})
        res = _java_ptb_tokenize({v: [hypotheses[v]] for v in ids})
        return gts, res
    gts = {v: [" ".join(ptb_tokenize(c)) for c in references[v]] for v in ids}
    res = {v: [" ".join(ptb_tokenize(hypotheses[v]))] for v in ids}
    return gts, res


def caption_metrics(
    references: Mapping[str, Sequence[str]],
    hypotheses: Mapping[str, str],
    *,
    meteor: bool = True,
    java: bool | None = None,
) -> dict[str, Any]:
    """Corpus-level caption metrics of ``hypotheses`` (one caption per video id).

    Args:
        references: video id -> its reference captions (raw text).
        hypotheses: video id -> the generated caption (raw text); every id needs references.
        meteor: score METEOR (starts a Java process: about a second).
        java: whether to use Java (default: when ``java`` is on the PATH).

    Returns:
        ``{"BLEU-1": .., ..., "METEOR": .. or None, "ROUGE-L": .., "CIDEr-D": ..,
        "tokenizer": "PTB (Java)" | "PTB (Python)", "errors": {metric: message}}``,
        the scores as fractions (CIDEr-D on its own scale, up to 10).
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    _check(references, hypotheses)
    java = java_available() if java is None else bool(java)
    gts, res = _tokenize(references, hypotheses, java)
    # A caption that tokenises to nothing is scored as it is (pycocoevalcap 1.2 accepts it).
    result: dict[str, Any] = {}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    result.update({f"BLEU-{n + 1}": float(value) for n, value in enumerate(bleu)})
    errors: dict[str, str] = {}
    result["METEOR"] = None
    if meteor and java:
        from pycocoevalcap.meteor.meteor import Meteor

        scorer = Meteor()
        try:
            result["METEOR"] = float(scorer.compute_score(gts, res)[0])
        finally:
            scorer.close() if hasattr(scorer, "close") else None
            del scorer
    elif meteor:
        errors["METEOR"] = (
            "METEOR needs Java (pycocoevalcap runs meteor-1.5.jar) and no 'java' is on the PATH; "
            "install a Java runtime (e.g. apt-get install default-jre-headless). The other "
            "metrics were scored with the Python PTB tokenisation."
        )
        warnings.warn(errors["METEOR"], RuntimeWarning, stacklevel=2)
    else:
        errors["METEOR"] = "not computed (meteor=False)"
    result["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    result["CIDEr-D"] = float(Cider().compute_score(gts, res)[0])
    result["tokenizer"] = "PTB (Java)" if java else "PTB (Python)"
    result["errors"] = errors
    return result


class CaptionMetrics(Metric):
    """:func:`caption_metrics` of the captions generated over batches.

    ``update(videos, hypotheses, references)``: per video of a batch, its id, its
    generated caption and its reference captions (raw text; None: it has none, which
    ``compute()`` refuses naming the video). ``compute()`` returns the
    dict of :func:`caption_metrics` (scores, ``tokenizer``, ``errors``) over every video
    added, in the order added; a video added twice counts once (its last caption, in
    the place of its first), as a dict updated batch by batch.

    Strings are not tensors: each video's ``[id, hypothesis, references]`` is kept as the
    UTF-8 bytes of its JSON text (one uint8 tensor per batch, and its length per video),
    so the states are tensors that torchmetrics concatenates across processes under DDP
    (``dist_reduce_fx="cat"``) like any other, and are decoded back at ``compute()``.
    ``kwargs`` go to torchmetrics' ``Metric`` (the captioning task passes
    ``sync_on_compute=False``: it gathers its processes' captions itself and scores them
    once, on process 0).
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, *, meteor: bool = True, java: bool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meteor, self.java = bool(meteor), java
        self.add_state("records", default=[], dist_reduce_fx="cat")  # uint8 UTF-8 JSON, concatenated
        self.add_state("record_lengths", default=[], dist_reduce_fx="cat")  # bytes per video

    def update(self, videos: Sequence[str], hypotheses: Sequence[str],
               references: Sequence[Sequence[str] | None]) -> None:
        if not len(videos) == len(hypotheses) == len(references):
            raise ValueError(
                f"CaptionMetrics.update: {len(videos)} videos, {len(hypotheses)} generated captions and "
                f"{len(references)} reference lists; expected one of each per video"
            )
        if isinstance(videos, str) or isinstance(hypotheses, str):
            raise ValueError("CaptionMetrics.update: videos and hypotheses are lists, one entry per video")
        texts = [
            json.dumps([str(video), caption, refs if refs is None or isinstance(refs, str) else list(refs)]).encode("utf-8")
            for video, caption, refs in zip(videos, hypotheses, references, strict=True)
        ]
        if not texts:
            return
        data = bytearray(b"".join(texts))
        self.records.append(torch.frombuffer(data, dtype=torch.uint8).to(self.device))
        self.record_lengths.append(torch.tensor([len(t) for t in texts], dtype=torch.long, device=self.device))

    def _decoded(self) -> tuple[dict[str, list[str]], dict[str, str]]:
        if isinstance(self.record_lengths, list) and not self.record_lengths:
            return {}, {}
        data = dim_zero_cat(self.records).cpu().numpy().tobytes()
        references: dict[str, list[str]] = {}
        hypotheses: dict[str, str] = {}
        start = 0
        for length in dim_zero_cat(self.record_lengths).tolist():
            video, caption, refs = json.loads(data[start : start + length].decode("utf-8"))
            start += length
            hypotheses[video] = caption  # as dict.update: the last copy counts
            if refs is not None:
                references[video] = refs
        return references, hypotheses

    def compute(self) -> dict[str, Any]:
        references, hypotheses = self._decoded()
        return caption_metrics(references, hypotheses, meteor=self.meteor, java=self.java)
