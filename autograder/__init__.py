"""Grading set-up for the course notebooks: nbgrader 0.9, driven through its Python API.

    python -m autograder release                   # solutions/NN_topic.ipynb -> notebooks/NN_topic.ipynb
    python -m autograder release --check           # exit 1 if notebooks/ is out of date
    python -m autograder grade SUBMISSIONS OUT     # SUBMISSIONS/<student>/NN_topic.ipynb -> OUT/grades.csv

``make release`` and ``make grade SUBMISSIONS=... OUT=...`` call these. Each chapter is its own
nbgrader assignment in a course directory built in a temp dir (see ``course.py``); the settings
are in ``nbgrader_config.py``.
"""

from .commands import grade, release, solution_files
from .course import Course, Score, cell_timeout, load_config

__all__ = ["Course", "Score", "cell_timeout", "grade", "load_config", "release", "solution_files"]
