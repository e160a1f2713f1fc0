"""Stage 5, report: what a graded class got wrong, at a glance.

Takes: an OUT folder that ``grade`` or ``merge`` wrote (rows.json, students.json, grading.json).
Gives: ``report_stats`` (the numbers: per test, per student, who needs help) and ``report`` (OUT/report/index.html
with its PNG figures and tests.csv, readable offline).
"""
