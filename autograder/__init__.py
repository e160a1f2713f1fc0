"""Grading set-up for the course notebooks: nbgrader 0.9, driven through its Python API.

    python -m autograder release                   # solutions/NN_topic.ipynb -> notebooks/NN_topic.ipynb
    python -m autograder release --check           # exit 1 if notebooks/ is out of date
    python -m autograder grade SUBMISSIONS OUT     # SUBMISSIONS/<student>/NN_topic.ipynb -> OUT/grades.csv, ...
    python -m autograder merge SHARDS... -o DIR    # the OUT folders of --shard K/N runs -> one OUT (-o X.csv: the sheet)
    python -m autograder report OUT                # OUT/report/index.html and tests.csv: what the class got wrong
    python -m autograder.bench                     # 50 synthetic submissions: seconds per notebook

``make release``, ``make grade SUBMISSIONS=... OUT=...`` and ``make report OUT=...`` call these. Each
chapter is its own nbgrader assignment in a course directory built in a temp dir (see ``course.py``);
the settings are in ``nbgrader_config.py``. The modules form a pipeline of stages, each importing
only the stages before it (``tests/test_imports.py``): shared (``rows``, ``notebooks``, ``sandbox``,
``warm``) -> intake (``platforms``, ``intake``) -> grade (``course``, ``job``, ``feedback``,
``grading``) -> record (``results``, ``review``) -> export (``gradebook``, ``merging``) -> report
(``report_stats``, ``report``), with ``batch`` (``grade``: the stages in order) and the command
line (``commands``, ``__main__``) on top.
"""

from .batch import Settings, grade_batch
from .commands import grade, release, solution_files
from .course import Course, Score, cell_timeout, load_config
from .results import merge

__all__ = ["Course", "Score", "Settings", "cell_timeout", "grade", "grade_batch", "load_config", "merge", "release",
           "solution_files"]
