"""Grading set-up for the course notebooks: nbgrader 0.9, driven through its Python API.

    python -m autograder release                   # solutions/NN_topic.ipynb -> notebooks/NN_topic.ipynb
    python -m autograder release --check           # exit 1 if notebooks/ is out of date
    python -m autograder grade SUBMISSIONS OUT     # SUBMISSIONS/<student>/NN_topic.ipynb -> OUT/grades.csv
    python -m autograder merge SHARDS... -o CSV    # join the grades.csv of --shard K/N runs
    python -m autograder.bench                     # 50 synthetic submissions: seconds per notebook

``make release`` and ``make grade SUBMISSIONS=... OUT=...`` call these. Each chapter is its own
nbgrader assignment in a course directory built in a temp dir (see ``course.py``); the settings
are in ``nbgrader_config.py``. Batch grading of untrusted submissions: ``batch.py`` (workers,
cache, shards), ``intake.py`` (submissions and preflight repairs), ``job.py`` (one notebook in a
child process), ``sandbox.py`` (the kernel launcher: namespaces and resource limits),
``feedback.py`` (the student's page), ``results.py`` (grades.csv, summary, merge).
"""

from .batch import Settings, grade_batch
from .commands import grade, release, solution_files
from .course import Course, Score, cell_timeout, load_config
from .results import merge

__all__ = ["Course", "Score", "Settings", "cell_timeout", "grade", "grade_batch", "load_config", "merge", "release",
           "solution_files"]
