"""Functional forms of the layers: ``F.relu(x)``, ``F.cross_entropy(logits, y)``, ...

Hand-written: it re-exports functions that the generated files of several
modules define (activations in 03, dropout in 04, losses in 05, convolutions in 09).
"""
from tinytrain.nn.activations import gelu, log_softmax, relu, sigmoid, softmax, tanh
from tinytrain.nn.layers import dropout, linear
from tinytrain.nn.losses import binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy, mse_loss
from tinytrain.nn.conv import avg_pool2d, conv2d, max_pool2d
