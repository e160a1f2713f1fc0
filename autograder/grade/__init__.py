"""Stage 2, grade: run one submission's notebook as nbgrader does, sandboxed, and score each graded cell.

Takes: intake's preflighted notebooks; shared's sandbox, warm kernels and nbgrader settings.
Gives: per notebook a score per graded cell and the student's feedback page without hidden tests: ``course`` (a
throwaway nbgrader course directory), ``job`` (one grading job in a child process), ``grading`` (the job started,
timed and checked against the canary), ``feedback`` (the page, redacted), ``quick``
(two fixed waits of a job cut: the kernel's ready check, the gradebook's engine), ``remember`` (the canary's
verdicts and the course set-up kept across runs).
"""
