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
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from polyfuse.text import ptb_tokenize

__all__ = ["CAPTION_METRICS", "caption_metrics", "java_available"]

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


def _tokenize(references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str], java: bool) -> tuple[dict, dict]:
    ids = list(hypotheses)
    if java:
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        tokenizer = PTBTokenizer()
        gts = tokenizer.tokenize({v: [{"caption": c} for c in references[v]] for v in ids})
        res = tokenizer.tokenize({v: [{"caption": hypotheses[v]}] for v in ids})
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
