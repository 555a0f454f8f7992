"""Task type grounding: Flickr30k Entities phrase localisation with BAN's attention
(``spec.py``: the spec, Lightning module and loss; ``data.py``: captions, phrases, targets
and region features of a run)."""
