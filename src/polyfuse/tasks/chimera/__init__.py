"""Task type chimera: topic and Lorentz-hyperbolic layers on a pre-trained encoder for
text-video retrieval (``spec.py``: the spec and Lightning module; ``lm.py``: the masked-LM
head of L_T; ``figure.py``: the hyperbolic layer's attention); ``tasks/ranking/`` holds
what it shares with retrieval."""
