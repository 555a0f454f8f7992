"""What the ranking task types (retrieval, Chimera) share: their corpus, splits and
shards (``data.py``), gathering embeddings over processes (``gather.py``), optimizer
groups and per-caption records (``groups.py``), the spec's shared part (``spec.py``:
evaluation over a split, the shuffled-words evaluation, records, the ranking figure and
the comparison tables), the Lightning module's evaluation loop (``module.py``), the
ranking figure (``figure.py``) and the EX1 / EX2 tables (``tables.py``)."""
