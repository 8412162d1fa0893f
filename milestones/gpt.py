"""Milestone: train a character-level GPT on Tiny Shakespeare with tinytrain.

    python milestones/gpt.py                      # nanoGPT's CPU recipe, offline, a few minutes
    python milestones/gpt.py --steps 200          # a quick look
    python milestones/gpt.py --help               # every option

Same as ``tinytrain milestone gpt``; see ``tinytrain/course/milestones.py`` (``run_gpt``).
"""
import sys

from tinytrain.course.cli import main

if __name__ == "__main__":
    sys.exit(main(["milestone", "gpt", *sys.argv[1:]]))
