"""Fixtures shared by the whole suite."""
import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench_script():
    """Import a bench/ script as a module by name (bench/ is a folder of scripts, not a package)."""
    def load(name: str):
        if str(BENCH) not in sys.path:
            sys.path.insert(0, str(BENCH))
        return importlib.import_module(name)

    return load


@pytest.fixture
def cli(capsys):
    """Run `trainfit ARGS...` in-process as a user would: returns (exit code, stdout, stderr)."""
    from trainfit.cli import main

    def run(*args):
        with pytest.raises(SystemExit) as e:
            main(list(args))
            raise SystemExit(0)
        out = capsys.readouterr()
        return e.value.code or 0, out.out, out.err

    return run
