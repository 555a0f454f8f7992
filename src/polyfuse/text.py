"""Text rules shared by data and metrics: the tokenisers and the answer normalisation.

The ground floor beside :mod:`polyfuse._checks`: :mod:`polyfuse.data` tokenises and
normalises with these functions to build vocabularies and targets, and
:mod:`polyfuse.metrics` to score, so that both apply the same rule and neither imports
the other.

* :func:`tokenize_question`: the words of a VQA question, as the bottom-up attention /
  ban-vqa dictionaries split them.
* :func:`normalize_answer` (:func:`process_punctuation`, :func:`process_digit_article`)
  and :func:`vqa_accuracy`: the answer rules of the official VQA 2.0 evaluation,
  ``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` of github.com/GT-Vision-Lab/VQA as
  it stands since commit a013f00 (2021, "Fixed processing answers bug"), written anew:

  1. Every answer, predicted or human, has newlines and tabs replaced by spaces and is
     stripped.
  2. Only when the ten human answers of a question are **not all the same string**, the
     prediction and every human answer are normalised (:func:`normalize_answer`):
     :func:`process_punctuation` then :func:`process_digit_article`. When all humans
     gave the same string, nothing is normalised and the prediction must equal it
     exactly ("Yes." and "yes!" score 0 against ten "yes"; "don't know" scores 1
     against ten "don't know").
  3. ``accuracy = mean over i of min(#{j != i : answers[j] == prediction} / 3, 1)``, the
     mean over the ten leave-one-out subsets of nine humans.

  The version in the repository between 2016 and 2021 (458a8b2, current when VQA 2.0
  was released) normalised the prediction always and the human answers with
  :func:`process_punctuation` only; its first version (07aecec, the 2015 beta) had
  another punctuation list (with ``:`` and ``'``, without ``!``, ``-``, ``{``, ``}``).
  The data use them for the answer vocabulary, the soft targets and each candidate
  answer's accuracy; :mod:`polyfuse.metrics.vqa` for the score.
* :func:`ptb_tokenize`: the PTB tokenisation of the MS COCO caption evaluation
  (pycocoevalcap), in Python: the caption vocabulary and the caption metrics without
  Java.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

__all__ = [
    "normalize_answer",
    "process_digit_article",
    "process_punctuation",
    "ptb_tokenize",
    "tokenize_question",
    "vqa_accuracy",
]


def tokenize_question(question: str) -> list[str]:
    """Lower-case words of a question; commas and question marks dropped, ``'s`` split off
    (as the bottom-up attention / ban-vqa dictionaries do).

    >>> tokenize_question("What's on the man's plate, left?")
    ['what', "'s", 'on', 'the', 'man', "'s", 'plate', 'left']
    """
    question = question.lower().replace(",", "").replace("?", "").replace("'s", " 's")
    return re.sub(r"\s+", " ", question).strip().split(" ") if question.strip() else []


# ---------------------------------------------------------------------------
# Answers: the official VQA 2.0 evaluation
# ---------------------------------------------------------------------------

# The tables of the official script (``manualMap``, ``articles``, ``punct``,
# ``contractions``), entry for entry.
_NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
    "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip
_ARTICLES = frozenset({"a", "an", "the"})
# No ":", "'", "." (periods have their own rule), "*", "#", "&", "%", "$" among them.
_PUNCTUATION = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]  # fmt: skip
# The official ``periodStrip`` is "(?!<=\d)(\.)(?!\d)": its "(?!<=\d)" is a look-ahead
# for the text "<=digit", never true at a ".", so the rule is: a period not followed by a
# digit. Python 2 compiled it without re.UNICODE, so \d is an ASCII digit (re.ASCII).
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)", re.ASCII)
# The script passes re.UNICODE (32) as ``sub``'s third argument, which is ``count``:
# at most 32 periods of an answer are removed.
_PERIOD_COUNT = int(re.UNICODE)
_COMMA_BETWEEN_DIGITS = re.compile(r"(\d)(,)(\d)", re.ASCII)
# Keys are matched against lower-cased words, so the four keys with a capital "I" never
# match; "somebody'd" is mapped to "somebodyd" (sic). Both kept as the script has them.
_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's",
    "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm",
    "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll",
    "let's": "let's", "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've",
    "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've",
    "she'dve": "she'd've", "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've", "somebodyll": "somebody'll",
    "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've",
    "someone'dve": "someone'd've", "someonell": "someone'll", "someones": "someone's",
    "somethingd": "something'd", "somethingd've": "something'd've", "something'dve": "something'd've",
    "somethingll": "something'll", "thats": "that's", "thered": "there'd", "thered've": "there'd've",
    "there'dve": "there'd've", "therere": "there're", "theres": "there's", "theyd": "they'd",
    "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're",
    "theyve": "they've", "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've",
    "weve": "we've", "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's", "whereve": "where've",
    "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've", "wholl": "who'll", "whos": "who's",
    "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't",
    "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've",
    "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll", "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd", "youd've": "you'd've",
    "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}  # fmt: skip


def _clean_whitespace(text: str) -> str:
    """Step 1 of the official script: newlines and tabs become spaces, ends stripped."""
    return text.replace("\n", " ").replace("\t", " ").strip()


# Answers repeat: VQA 2.0 has ~4M answers, far fewer distinct ones.
@functools.lru_cache(maxsize=1 << 16)
def process_punctuation(text: str) -> str:
    """The official ``processPunctuation``.

    Each mark of the list is removed where the text has it next to a space (``mark + " "``
    or ``" " + mark`` anywhere in the text) or where the text has a comma between two
    digits; otherwise it is replaced by a space. Then up to 32 periods not followed by a
    digit are removed. Case and spacing are left as they are.

    >>> process_punctuation("t-shirt"), process_punctuation("yes!"), process_punctuation("1,000 dollars!")
    ('t shirt', 'yes ', '1000 dollars')
    """
    out = text
    strip_all = _COMMA_BETWEEN_DIGITS.search(text) is not None
    for mark in _PUNCTUATION:
        if strip_all or mark + " " in text or " " + mark in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD.sub("", out, count=_PERIOD_COUNT)


@functools.lru_cache(maxsize=1 << 16)
def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower case, split on whitespace, number words
    "none" and "zero" to "ten" to digits, articles "a", "an", "the" dropped, then each
    remaining word looked up in the contraction table ("dont" -> "don't"); words joined by
    one space.

    >>> process_digit_article("The Two dont")
    "2 don't"
    """
    words = [_NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    words = [_CONTRACTIONS.get(word, word) for word in words if word not in _ARTICLES]
    return " ".join(words)


def normalize_answer(text: str) -> str:
    """The official normalisation of an answer: whitespace cleaned, then
    :func:`process_punctuation`, then :func:`process_digit_article`. The official
    accuracy applies it only to questions whose human answers differ
    (:func:`vqa_accuracy`).

    >>> normalize_answer("Two dogs.")
    '2 dogs'
    """
    return process_digit_article(process_punctuation(_clean_whitespace(text)))


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """Official VQA 2.0 accuracy of one prediction against the human answers, in [0, 1].

    Whitespace cleaned; the prediction and the answers normalised only when the cleaned
    answers are not all the same string; then
    ``mean over i of min(#{j != i : answers[j] == prediction} / 3, 1)``.

    Raises:
        ValueError: ``answers`` is empty.
    """
    if len(answers) == 0:
        raise ValueError("vqa_accuracy: the question has no human answers")
    prediction = _clean_whitespace(prediction)
    answers = [_clean_whitespace(answer) for answer in answers]
    if len(set(answers)) > 1:
        prediction = normalize_answer(prediction)
        answers = [normalize_answer(answer) for answer in answers]
    matches = sum(answer == prediction for answer in answers)
    total = 0.0
    for answer in answers:  # leave this human out
        total += min((matches - (answer == prediction)) / 3.0, 1.0)
    return total / len(answers)



# ---------------------------------------------------------------------------
# Captions: the PTB tokenisation of the MS COCO caption evaluation
# ---------------------------------------------------------------------------

# pycocoevalcap's PTBTokenizer: Stanford's PTBTokenizer (-lowerCase), then these
# tokens are dropped (pycocoevalcap/tokenizer/ptbtokenizer.py, PUNCTUATIONS).
# Its list names "-LRB-" ... in upper case, but the tokeniser lower-cases first, so
# brackets stay (as "-lrb-" ...).
_DROPPED = {"''", "'", "``", "`", ".", "?", "!", ",", ":", "-", "--", "...", ";"}
_CLITICS = re.compile(r"(?i)([^\W_])(n't|'s|'re|'ll|'ve|'m|'d)\b")
_PIECES = re.compile(r"(?i)n't|'(?:s|re|ll|ve|m|d)\b|\.\.\.|--|[^\W_]+(?:[-./][^\W_]+)*|\S")
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-", '"': "''", "\u201c": "``", "\u201d": "''", "\u2018": "`", "\u2019": "'"}


def ptb_tokenize(caption: str) -> list[str]:
    """Lower-cased tokens as pycocoevalcap's PTB tokenisation gives them (in Python).

    Words keep inner hyphens, dots and slashes (``t-shirt``, ``3.5``);
    the clitics ``n't 's 're 'll 've 'm 'd`` are split off; brackets become PTB's
    ``-lrb-`` ...; the punctuation tokens that the metrics drop are dropped. Checked
    against the Java tokeniser on MSVD captions (tests/tasks/captioning/test_captioning_data.py).
    """
    text = _CLITICS.sub(r"\1 \2", caption.replace("\n", " "))
    tokens = [_BRACKETS.get(piece, piece.lower()) for piece in _PIECES.findall(text)]
    return [t for t in tokens if t not in _DROPPED]
