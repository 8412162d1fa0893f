"""Functional forms of the layers: ``F.relu(x)``, ``F.cross_entropy(logits, y)``, ...

Hand-written: it re-exports functions that the generated files of several
modules define (activations in 03, dropout in 04, losses in 05, convolutions in 09).
"""
