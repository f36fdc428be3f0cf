"""The console every report prints to (rich's), one rule for its width."""
from __future__ import annotations

import os

from rich.console import Console

# Columns a report gets where stdout is no terminal (a pipe, a file) and COLUMNS is unset: rich's default there is
# 80, at which a wide table (plan's, sweep's) cuts its cells to "65,…"; at this width every table keeps its natural
# width (its columns' longest cells) and a note is one line, for grep and for a file read later.
PIPED_WIDTH = 400


def console() -> Console:
    """rich's Console on stdout: the terminal's width on a terminal (or COLUMNS), else PIPED_WIDTH."""
    c = Console()
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(width=PIPED_WIDTH)
    return c
