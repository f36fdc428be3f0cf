"""Fixtures shared by the whole suite."""
import pytest


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
