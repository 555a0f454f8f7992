"""Task types: one folder each (``tasks/<type>/``: its spec, Lightning module, data
preparation, new-input handling and figures), registered with
:func:`polyfuse.tasks.registry.register_task`; importing this package registers them all.
Shared by several: ``registry.py`` (the spec and its registry), ``building.py`` (models
from a configuration), ``base.py`` (optimisers, schedules and the Lightning module of the
classification-like tasks), ``attention_figure.py`` (MAN's and BAN's attention of one
item), ``ranking/`` (what retrieval and Chimera share)."""

import polyfuse.tasks.captioning.spec  # registers task.type captioning
import polyfuse.tasks.chimera.spec  # registers chimera
import polyfuse.tasks.grounding.spec  # registers grounding
import polyfuse.tasks.retrieval.spec  # registers retrieval
import polyfuse.tasks.tabular.spec  # registers sentiment, traits, classification
import polyfuse.tasks.vqa.spec  # noqa: F401  # registers vqa
