"""Milestone: train a multi-layer perceptron end to end with tinytrain.

    python milestones/mlp.py                      # Digits, offline, about 10 s
    python milestones/mlp.py --dataset mnist      # downloads MNIST once
    python milestones/mlp.py --help               # every option

Same as ``tinytrain milestone mlp``; see ``tinytrain/course/milestones.py``.
"""
import sys

from tinytrain.course.cli import main

if __name__ == "__main__":
    sys.exit(main(["milestone", "mlp", *sys.argv[1:]]))
