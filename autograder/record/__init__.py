"""Stage 3, record: the grade sheet.

Takes: the grade stage's scores and statuses.
Gives: ``results`` (a ``Row`` per student and notebook, grades.csv and rows.json, the summary table, shards and
their merge) and ``review`` (pages for the free-text answers a person grades, and their points merged back).
"""
