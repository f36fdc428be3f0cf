"""The command line (typer): parses arguments into the library's dataclasses and hands results to a report.

app.py holds the core commands and `main`; plan.py and visual.py the planner and the pictures; options.py
generates every command's setting options from trainfit.setup.SETTINGS.
"""
from .app import app, main

__all__ = ["app", "main"]
