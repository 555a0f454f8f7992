"""How generated captions end: the share that ends in "a", and what ended them.

Reads the ``test_captions.json`` of captioning run folders (``polyfuse train``'s run
directory, or every run below a ``polyfuse compare`` output) and, per run, counts the
test captions, those whose last word is "a", and those that reached
``captioning.max_length`` tokens (the run's config.yaml; the search then cuts them, see
``polyfuse.nn.beam_search``): a caption shorter than that ended on the end token, chosen
by the search. docs/RESULTS.md ("Captioning results: VGG + motion") gives the numbers of

    python scripts/caption_endings.py runs/maf/seed? runs/ddp-rows

With ``--probe`` each run's best checkpoint is loaded and, for every caption ending in
"a", the decoder is fed that caption and the probabilities of its next token printed
(the end token, ``<unk>``, the five likeliest words), and the video is decoded again with
``<unk>`` allowed (needs the run's feature files).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def runs_below(folders: list[Path]) -> list[Path]:
    """The run folders (holding test_captions.json) at or below ``folders``, sorted."""
    return sorted({p.parent for folder in folders for p in [*folder.glob("test_captions.json"),
                                                            *folder.rglob("*/test_captions.json")]})


def endings(run: Path) -> dict:
    """Counts of one run: captions, ending in "a", reaching max_length; the "a" captions."""
    captions = {video: entry["generated"] for video, entry in json.loads((run / "test_captions.json").read_text()).items()}
    config = yaml.safe_load((run / "config.yaml").read_text())
    max_length = int(config["captioning"]["max_length"])
    words = {video: caption.split() for video, caption in captions.items()}
    ending_a = {video: captions[video] for video, w in words.items() if w[-1:] == ["a"]}
    # max_length counts the end token: a caption of max_length words was cut, not ended.
    cut = sum(len(w) >= max_length for w in words.values())
    return {"captions": len(captions), "ending_a": ending_a, "cut": cut,
            "longest": max((len(w) for w in words.values()), default=0), "max_length": max_length}


def probe(run: Path, videos: dict[str, str]) -> None:
    """Print the next-token probabilities after each caption of ``videos`` and its re-decoding
    with ``<unk>`` allowed."""
    import torch

    from polyfuse.data.formats.captioning import UNKNOWN
    from polyfuse.engine.run import load_model
    from polyfuse.nn.beam_search import score_captions
    from polyfuse.tasks.registry import task_spec

    task, extras = load_model(run / "checkpoints" / "best.safetensors")
    task.eval()
    spec = task_spec("captioning")
    data = spec.checkpoint_data(extras, split="test")
    spec.bind(task, data)
    (loader,) = spec.loaders(data, "test").values()
    vocabulary = task.vocabulary
    unknown, end = vocabulary.index[UNKNOWN], vocabulary.end
    for batch in loader:
        for row, video in enumerate(batch["videos"]):
            if video not in videos:
                continue
            inputs = [x[row : row + 1] for x in batch["inputs"]]
            masks = [m[row : row + 1] for m in batch["masks"]]
            ids = vocabulary.encode(videos[video], task.max_length)[1:-1]
            tokens = torch.tensor([ids])
            with torch.no_grad():
                encoded = task.model.encode(inputs, masks)
                _, steps = score_captions(task.model.decoder, encoded, masks, tokens,
                                          begin_index=vocabulary.begin, end_index=end)
                # the step after the caption's last word: feed it once more
                state, word = steps[-1].state, tokens[:, -1]
                sequences, full_masks = task.model.decoder.prepare(encoded, masks)
                logits = task.model.decoder.step(word, state, sequences, full_masks).logits[0].float()
            p = torch.softmax(logits, dim=-1)  # over every token, <unk> included
            top = [(vocabulary.words[i], round(float(p[i]), 3)) for i in p.topk(5).indices.tolist()]
            print(f"  {video} {videos[video]!r}: next token P(end) {float(p[end]):.3f}, "
                  f"P(<unk>) {float(p[unknown]):.2e}, top five {top}")
            task.allow_unknown = True
            with torch.no_grad():
                again = vocabulary.decode(task.generate(inputs, masks).tokens[0].tolist())
            task.allow_unknown = False
            print(f"    decoded again with <unk> allowed: {again!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run folders or polyfuse compare outputs")
    parser.add_argument("--probe", action="store_true", help="load each checkpoint and probe the captions ending in 'a'")
    args = parser.parse_args(argv)
    runs = runs_below(args.folders)
    if not runs:
        parser.error("no test_captions.json at or below " + ", ".join(map(str, args.folders)))
    total = {"captions": 0, "ending_a": 0, "cut": 0}
    for run in runs:
        counts = endings(run)
        total["captions"] += counts["captions"]
        total["ending_a"] += len(counts["ending_a"])
        total["cut"] += counts["cut"]
        print(f"{run}: {len(counts['ending_a'])} of {counts['captions']} end in 'a'; "
              f"{counts['cut']} reached max_length {counts['max_length']} (longest: {counts['longest']} words)"
              + "".join(f"; {video}: {caption!r}" for video, caption in counts["ending_a"].items()))
        if args.probe and counts["ending_a"]:
            probe(run, counts["ending_a"])
    print(f"{len(runs)} runs: {total['ending_a']} of {total['captions']} captions end in 'a'; "
          f"{total['cut']} reached max_length, the others ended on the end token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
