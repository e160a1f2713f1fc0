"""Stage 1, intake: a class's submissions as an LMS exported them, before any student code runs.

Takes: a folder or a zip (Canvas, Moodle, Gradescope, or ``<student>/NN_topic.ipynb``) and the course's stems.
Gives: one folder per student with its notebooks matched to the chapters, late flags and names (``platforms``),
each notebook preflighted: refused when it is not one, outputs cleared, kernel reset (``intake``).
"""
