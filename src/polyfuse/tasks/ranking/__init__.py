"""What the ranking task types (retrieval, Chimera) share: their corpus, splits and
shards (``data.py``), gathering embeddings over processes (``gather.py``), optimizer
groups and per-caption records (``groups.py``)."""
