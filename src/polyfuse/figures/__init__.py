"""Figures: every PNG polyfuse draws, as pure drawing functions.

A function here takes what it draws (arrays, dicts of numbers, rows of a benchmark's
payload) and the path to write, and returns that path; it never loads a run, a
checkpoint or a clip. The floor sits below those that load what a figure shows and
call these (``engine/``, ``bench/``, a task spec's figures in ``tasks/``) and above
``nn/``, ``data/`` and ``metrics/``, which never draw; it imports only ``data/``,
``metrics/``, ``functional/`` and the ground floor (tests/test_layers.py holds it to that).
matplotlib (the ``plots`` extra) is imported inside the functions, Agg backend.

- :mod:`~polyfuse.figures.common`: the pyplot module and the one way a figure is saved.
- :mod:`~polyfuse.figures.curves`: learning curves per epoch.
- :mod:`~polyfuse.figures.attention`: MAN's marginal attention over time, BAN's maps.
- :mod:`~polyfuse.figures.vqa`: BAN's attention over an image grid and question words;
  the bars of a VQA comparison.
- :mod:`~polyfuse.figures.captioning`: a video's frames, captions and MAF attention per word.
- :mod:`~polyfuse.figures.retrieval`: the top-k videos of a text query as thumbnails.
- :mod:`~polyfuse.figures.benchmarks`: the figures of ``polyfuse bench``.
"""
