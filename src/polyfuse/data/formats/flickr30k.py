"""Flickr30k Entities annotations (Plummer et al., ICCV 2015): phrases and their boxes.

``Sentences/<image id>.txt`` has one caption per line with phrases marked as
``[/EN#<entity id>/<type>[/<type>...] words of the phrase]``; ``Annotations/<image id>.xml``
(Pascal VOC style) lists ``<object>`` elements whose ``<name>`` children are entity
ids and whose ``<bndbox>`` holds ``xmin ymin xmax ymax`` in pixels (objects without
a box have ``<nobndbox>1</nobndbox>`` instead).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Phrase", "parse_boxes", "parse_sentence"]

_PHRASE = re.compile(r"\[/EN#(\d+)((?:/[^\s\]]+)+) ([^\]]+)\]")


@dataclass(frozen=True)
class Phrase:
    """A marked phrase: its words, where it starts in the caption, its entity and types."""

    text: str
    first_word: int
    entity_id: int
    types: tuple[str, ...]


def parse_sentence(line: str) -> tuple[list[str], list[Phrase]]:
    """Words of a caption (markup removed) and its phrases.

    Raises:
        ValueError: an opening ``[/EN#`` without a well-formed phrase.
    """
    words: list[str] = []
    phrases: list[Phrase] = []
    position = 0
    line = line.strip()
    for match in _PHRASE.finditer(line):
        before = line[position : match.start()]
        if "[/EN#" in before:
            raise ValueError(f"malformed phrase markup in {line!r}")
        words += before.split()
        text = match.group(3).strip()
        phrases.append(Phrase(text, len(words), int(match.group(1)), tuple(match.group(2).strip("/").split("/"))))
        words += text.split()
        position = match.end()
    rest = line[position:]
    if "[/EN#" in rest:
        raise ValueError(f"malformed phrase markup in {line!r}")
    return words + rest.split(), phrases


def parse_boxes(path: str | Path) -> tuple[dict[int, list[tuple[float, float, float, float]]], tuple[int, int]]:
    """Boxes per entity id in pixels, and the image size (width, height), from an annotation XML."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Flickr30k Entities annotation {path} does not exist")
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        raise ValueError(f"{path}: not valid XML ({error})") from None
    size = root.find("size")
    if size is None or size.findtext("width") is None or size.findtext("height") is None:
        raise ValueError(f"{path}: no <size> with <width> and <height>")
    dimensions = (int(size.findtext("width")), int(size.findtext("height")))
    boxes: dict[int, list[tuple[float, float, float, float]]] = {}
    for number, item in enumerate(root.iter("object")):
        box = item.find("bndbox")
        if box is None:
            continue  # <nobndbox> or <scene>: an entity without a box
        try:
            corners = tuple(float(box.findtext(tag)) for tag in ("xmin", "ymin", "xmax", "ymax"))
        except (TypeError, ValueError):
            raise ValueError(f"{path}: object {number} has an incomplete <bndbox>") from None
        for name in item.findall("name"):
            boxes.setdefault(int(name.text), []).append(corners)
    return boxes, dimensions
