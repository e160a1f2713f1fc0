# nbgrader settings for grading the course notebooks headless (no JupyterHub, no exchange).
# autograder/grade/course.py loads this file for every course directory it builds; the directory
# layout (root, gradebook) is set there, per run, because the course lives in a temp dir.
#
# The values here are the contract of docs/COURSE_PIPELINE.md: a graded test cell wraps its
# work in `grading.checked(seconds=N)`, and the per-cell kernel timeout below must be larger
# than every N (tests/test_pipeline.py checks it for every solutions/*.ipynb).

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

# A cell running longer than this is interrupted and scores 0; the batch goes on.
# It must exceed every grading.checked(seconds=N) in the notebooks (the time-limited speed
# checks use up to 120 s), so a correct solution never gets near it.
c.Execute.timeout = 180
# Starting a kernel (and importing torch) on a busy 2-core machine can take a while.
c.Execute.startup_timeout = 120
# Always run submissions in the course's own Python kernel, whatever the student's
# notebook metadata says (nbgrader also overwrites the kernelspec from the gradebook).
c.Execute.kernel_name = "python3"
c.Execute.interrupt_on_timeout = True
# Once the last cell has run nothing in the kernel is needed: kill it instead of waiting for a
# graceful shutdown (saves about a second per submission).
c.Execute.shutdown_kernel = "immediate"
# The kernel's own log goes to the grading terminal, not to the notebook: keep only errors
# (ipykernel warns about plain-TCP transport at every start; the kernel is local).
c.Execute.extra_arguments = ["--IPKernelApp.log_level=ERROR"]

# What replaces the solution regions in the released notebooks (nbgrader's default, spelled
# out because docs/COURSE_PIPELINE.md promises exactly this text).
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Only the notebook travels: never copy checkpoints or caches from source/ into release/.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]
