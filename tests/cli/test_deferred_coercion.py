"""The CLI's deferred parameter coercion (cli/options.py `_DeferredCoercion`): what it returns is what typer's own
coercion (the pydantic adapter typer builds, typer/_coercion.py `build_runtime_param`) returns, and an estimate
with default options never imports pydantic (the adapters' ~0.3 s of start-up)."""
import subprocess
import sys

import pytest

coercion = pytest.importorskip("typer._coercion")


def _params():
    from trainfit.cli import app
    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for p in command.params:
            yield name, p


def test_deferred_coercion_returns_what_typers_adapter_returns():
    import click

    from trainfit.cli.options import _DeferredCoercion

    samples = {str: ["x", "H100-80GB", " 4 ", ""], int: [0, 1, 4096, -3, 2**70], float: [0.0, 0.9, -1.5, float("inf")]}
    checked = 0
    for name, p in _params():
        assert isinstance(p._runtime_param, _DeferredCoercion), (name, p.name)
        d = p.type_descriptor
        ctx = click.Context(click.Command(name))
        values = [p.default, None] + samples.get(d.annotation, [])
        for v in values:
            if v is None or (d.annotation in samples and type(v) is d.annotation) or v == p.default:
                try:
                    want = coercion.build_runtime_param(d).coerce(v, param=p, ctx=ctx)
                except click.exceptions.BadParameter:
                    continue
                got = p._runtime_param.coerce(v, param=p, ctx=ctx)
                assert got == want and type(got) is type(want), (name, p.name, v, got, want)
                checked += 1
    assert checked > 500


def test_a_default_estimate_does_not_import_pydantic():
    code = ("import sys; from trainfit.cli import main\n"
            "try:\n    main(['estimate', 'llama-3.1-8b', '--gpu', 'H100-80GB', '--json'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "sys.exit(10 + ('pydantic' in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 10, r.stderr[-2000:]
