"""Stage 4, export: the grades out of the course, into the places instructors use.

Takes: the recorded rows (one OUT folder, or the OUT folders of several shards).
Gives: ``gradebook`` (grades.csv, gradebook.csv, the Canvas and Moodle import files, the feedback zip) and
``merging`` (shards' OUT folders joined into one, as if graded on one machine).
"""
