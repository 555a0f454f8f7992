"""Tiny data sets and configurations that several test files train on, one module per
task type (``tabular``, ``vqa``, ``captioning``, ``retrieval``, ``chimera``), the
synthetic engine configurations (``synthetic``) and the table of one tiny configuration
per registered task type (``tasks.TINY``). Test files import these; no test file
imports another."""

#: the trainer section of every tiny task configuration: 3 epochs on one CPU thread, silent
TRAINER = {"max_epochs": 3, "patience": 0, "accelerator": "cpu", "progress_bar": False, "quiet": True, "num_threads": 1}
