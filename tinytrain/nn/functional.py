"""Functional forms of the layers: ``F.relu(x)``, ``F.cross_entropy(logits, y)``, ...

Hand-written: it re-exports functions that the generated files of several
modules define (activations in 03, linear in 04, dropout in 05, losses in 06, convolutions in 11,
embeddings and attention in 14, distillation in 20).
"""
from tinytrain.nn.activations import gelu, log_softmax, relu, sigmoid, softmax, tanh
from tinytrain.nn.dropout import dropout
from tinytrain.nn.layers import linear
from tinytrain.nn.losses import binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy, mse_loss
from tinytrain.nn.conv import avg_pool2d, conv2d, max_pool2d
from tinytrain.nn.embedding import embedding
from tinytrain.nn.attention import scaled_dot_product_attention
from tinytrain.nn.distillation import distillation_loss
