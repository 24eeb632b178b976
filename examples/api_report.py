"""The main job as a task file: `overnight run examples/api_report.py`.

An API reference of the standard library's `email` package, one checkpoint per module. Edit
PACKAGE to document another installed package. The steps live in `overnight.demo.api_report`.
"""

from overnight.demo.api_report import make_task

PACKAGE = "email"

task = make_task(package=PACKAGE)
