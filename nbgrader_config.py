# nbgrader settings for whoever runs nbgrader from this folder: the Validate button of the
# Jupyter extension, `nbgrader validate`, the formgrader. (The batch grader has its own settings
# in autograder/shared/nbgrader_config.py.)
c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

# Validate cuts each failing test's message at 90 columns by default; the course's messages say
# "got ..., expected ..." and must be read whole.
c.Validator.width = 1000
