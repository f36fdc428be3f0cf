"""The import contract of DESIGN.md §2 (pyproject.toml [tool.importlinter], run by import-linter), in the default
test run:
  1. the layers: cli > web > report > api > plan, studies > engines > trace, measure > step > analytic > models >
     core; a module importing upwards fails here;
  2. one door to the engines: nothing outside trainfit.engines imports trainfit.trace, trainfit.measure or
     trainfit.analytic.engine (the analytic engine's entry); the package's __init__ included.
Imports inside functions count as much as those at the top of a module."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).with_name("lint-imports"))
    if not pathlib.Path(exe).exists():
        pytest.fail("import-linter is missing: pip install -e '.[test]'")
    # this checkout's sources, whatever copy of trainfit the environment has installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([exe, "--no-cache", *args], cwd=ROOT, capture_output=True, text=True, env=env)


def test_import_contract_is_kept():
    r = lint_imports()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "3 kept, 0 broken" in r.stdout


def test_the_contract_catches_a_caller_that_routes_around_the_engines(tmp_path):
    """A lazy import of the trace engine in the report, and the analytic engine's entry in the planner: both broken
    (the contract is checked on a copy of the sources with those two imports added)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "trainfit", src / "trainfit", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, line in (("report/html.py", "from ..trace.engine import trace_spec"),
                      ("plan/verify.py", "from ..analytic.engine import estimate")):
        f = src / "trainfit" / rel
        f.write_text(f.read_text() + f"\n\ndef _around():\n    {line}\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).with_name("lint-imports"))
    r = subprocess.run([exe, "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(src)})
    assert r.returncode == 1, r.stdout[-3000:]
    assert "trainfit.report.html -> trainfit.trace.engine" in r.stdout
    assert "trainfit.plan.verify -> trainfit.analytic.engine" in r.stdout
