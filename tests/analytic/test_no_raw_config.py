"""No analytic module reads the raw HF config: every config value a formula needs is a ModelSpec field, resolved once
by trainfit.models.hf_config (so a cache keyed on the spec is keyed on every fact, and one place reads each key).
Checked on the source's syntax tree: no `.config` attribute on anything, no function taking a `config` parameter."""
from __future__ import annotations

import ast
from pathlib import Path

import trainfit.analytic

ANALYTIC = Path(trainfit.analytic.__file__).parent
RAW_PARAMS = {"config", "cfg", "hf_config", "config_json"}


def raw_config_reads(source: str) -> list[str]:
    """'line: what' for each read of a raw config in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "config":
            found.append(f"{node.lineno}: .config")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                if arg.arg in RAW_PARAMS:
                    found.append(f"{node.lineno}: parameter {arg.arg!r}")
    return sorted(found)


def test_the_detector_finds_each_kind_of_read():
    src = ("def f(spec):\n    return spec.config.get('x')\n"
           "def g(config: dict):\n    return config['x']\n"
           "h = lambda cfg: cfg\n")
    assert raw_config_reads(src) == ["2: .config", "3: parameter 'config'", "5: parameter 'cfg'"]
    # an import of the allocator's settings module is no read of a model config
    assert raw_config_reads("from ..alloc.config import AllocConf\nimport json\n") == []


def test_no_analytic_module_reads_the_raw_config():
    files = sorted(ANALYTIC.rglob("*.py"))
    assert len(files) > 20
    reads = {str(f.relative_to(ANALYTIC)): r for f in files if (r := raw_config_reads(f.read_text()))}
    assert reads == {}, f"read ModelSpec fields instead (models/hf_config.py resolves them): {reads}"
