"""Grading set-up for the course notebooks: nbgrader 0.9, driven through its Python API.

    python -m autograder release                   # solutions/NN_topic.ipynb -> notebooks/NN_topic.ipynb
    python -m autograder release --check           # exit 1 if notebooks/ is out of date
    python -m autograder grade SUBMISSIONS OUT     # SUBMISSIONS/<student>/NN_topic.ipynb -> OUT/grades.csv, ...
    python -m autograder merge SHARDS... -o DIR    # the OUT folders of --shard K/N runs -> one OUT (-o X.csv: the sheet)
    python -m autograder report OUT                # OUT/report/index.html and tests.csv: what the class got wrong
    python -m autograder.bench                     # 50 synthetic submissions: seconds per notebook

``make release``, ``make grade SUBMISSIONS=... OUT=...`` and ``make report OUT=...`` call these. Each
chapter is its own nbgrader assignment in a course directory built in a temp dir (see ``grade/course.py``).
The pipeline's stages are folders, in order; each imports only the stages before it
(``tests/test_imports.py``), and each folder's ``__init__`` says what the stage takes and gives:

    shared/   rows, notebooks, sandbox, warm kernels, nbgrader_config, mutants   (imports no stage)
    intake/   platforms, intake          an LMS export -> one preflighted folder per student
    grade/    course, job, grading, feedback   a notebook -> scores per cell, a feedback page
    record/   results, review            scores -> the grade sheet (rows, shards), free-text review
    export/   gradebook, merging         the sheet -> grades.csv, LMS import files, feedback zip
    report/   report_stats, report       an OUT folder -> the class report

On top: ``batch`` (the stages in order for a class), ``commands`` and ``__main__`` (the command line), ``check``
(a student's self-check), ``gradescope``, ``student`` (the student edition), ``bench`` and ``mutation``.
"""

from autograder.batch import Settings, grade_batch
from autograder.commands import release, solution_files  # the command `grade`: autograder.commands.grade
# (autograder.grade is the grade stage's folder)
from autograder.grade.course import Course, Score, cell_timeout, load_config
from autograder.record.results import merge

__all__ = ["Course", "Score", "Settings", "cell_timeout", "grade_batch", "load_config", "merge", "release",
           "solution_files"]
