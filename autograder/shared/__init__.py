"""Stage 0, shared: what every later stage uses; imports no other stage.

Takes: nothing from the pipeline.
Gives: ``rows`` (a ``Row`` per student and notebook, the statuses, the ``Say`` callback), ``notebooks`` (secret and
public lines of an instructor source, a perfect or a wrong submission), ``sandbox`` (student code run without root),
``warm``/``warm_server``/``warm_client`` (kernels forked from a process that already imported torch and kvref),
``nbgrader_config`` (the batch grader's nbgrader settings) and ``mutants`` (the AST mutator of solution regions).
"""
