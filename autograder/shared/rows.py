"""What every stage shares: one ``Row`` per student and notebook, the statuses a row can have, and
``Say``, the callback through which the stages talk to the instructor (stderr by default)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

STATUSES = {
    "ok": "graded; the score is what the tests gave (the reason lists lost points and repairs)",
    "missing": "the student handed in no notebook of this name",
    "invalid": "the file is not a notebook nbgrader can read (not JSON, not nbformat, too large)",
    "timeout": "stopped: a cell ignored the interrupt after the per-cell limit, or the notebook ran past the "
               "per-notebook wall-clock limit",
    "error": "nbgrader could not grade it (for example the kernel died); see the reason",
    "needs_review": "graded automatically; free-text answers wait for a person (`review`, then `grade --manual`): "
                    "the score holds the automatic points so far",
}

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Row:
    student: str
    notebook: str
    score: float
    max_score: float
    status: str = "ok"
    reason: str = ""
    late: bool = False
    seconds: float = 0.0  # not in the CSV
    tests: list = dataclasses.field(default_factory=list)  # [{name, score, max_score, output}], not in the CSV
    manual: dict = dataclasses.field(default_factory=dict)  # {grade_id: {max_score, answer}}, not in the CSV
    timing: dict = dataclasses.field(default_factory=dict)  # where the seconds went (job.py), not in the CSV
    stretch: str = ""  # what the ungraded stretch's own check said (job.stretch_report; `check` shows it), not in the CSV
