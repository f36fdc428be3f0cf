"""The import layers of DESIGN.md §2, enforced: cli > web > report > api > plan, studies > engines > trace, measure >
step > analytic > models > core (pyproject.toml [tool.importlinter]). A module importing upwards fails here."""
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_layer_contract_is_kept():
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).with_name("lint-imports"))
    if not pathlib.Path(exe).exists():
        pytest.fail("import-linter is missing: pip install -e '.[test]'")
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 kept, 0 broken" in r.stdout
