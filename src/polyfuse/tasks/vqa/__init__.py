"""Task type vqa: questions about images (``spec.py``: the spec and Lightning module;
``data.py``: questions, vocabularies and image features of a run; ``new_questions.py``:
a checkpoint applied to new questions and images; ``attention.py``: BAN's maps over an
image; ``report.py``: accuracy per answer type in a comparison)."""
