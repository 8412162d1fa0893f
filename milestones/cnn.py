"""Milestone: train a convolutional network end to end with tinytrain.

    python milestones/cnn.py                      # Digits, offline: about 20 s on 2 CPU cores
    python milestones/cnn.py --dataset mnist      # downloads MNIST once
    python milestones/cnn.py --dataset cifar10    # downloads CIFAR-10 once; hours on a CPU
    python milestones/cnn.py --help               # every option

Same as ``tinytrain milestone cnn``; see ``tinytrain/course/milestones.py`` (``build_cnn``).
"""
import sys

from tinytrain.course.cli import main

if __name__ == "__main__":
    sys.exit(main(["milestone", "cnn", *sys.argv[1:]]))
