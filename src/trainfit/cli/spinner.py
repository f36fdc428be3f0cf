"""A spinner on stderr for work that can take more than 2 s; nothing when printing JSON (stdout stays clean)."""
import contextlib


def spinner(what: str, quiet: bool = False):
    if quiet:
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(f"{what} …")
