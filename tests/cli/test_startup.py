"""The CLI's start-up shortcuts (cli/options.py): the deferred parameter coercion (`_DeferredCoercion`) returns
what typer's own coercion (the pydantic adapter typer builds, typer/_coercion.py `build_runtime_param`) returns,
and an estimate with default options never imports pydantic (the adapters' ~0.3 s of start-up); the lazy group
(`lazy_group`) has typer's commands, in typer's order, each the same command, and builds only the one invoked."""
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


def test_lazy_group_has_typers_commands_and_builds_only_the_invoked_one():
    import click
    import typer.main

    from trainfit.cli import app
    from trainfit.cli.options import lazy_group

    eager, lazy = typer.main.get_command(app), lazy_group(app)
    ctx = click.Context(eager, info_name="trainfit")
    assert lazy.list_commands(ctx) == eager.list_commands(ctx) and len(eager.commands) > 10
    assert lazy.commands._built == {}
    assert lazy.get_command(ctx, "estimate") is not None and list(lazy.commands._built) == ["estimate"]
    assert lazy.get_command(ctx, "estimat") is None and list(lazy.commands._built) == ["estimate"]
    assert lazy.get_help(click.Context(lazy, info_name="trainfit")) == ctx.get_help()
    for name in eager.list_commands(ctx):
        a, b = eager.commands[name], lazy.commands[name]
        assert type(a) is type(b) and a.help == b.help, name
        assert [(p.name, p.opts, p.default, p.type_descriptor.annotation) for p in a.params] == \
            [(p.name, p.opts, p.default, p.type_descriptor.annotation) for p in b.params], name


def test_python_m_trainfit_runs_the_command():
    """`python -m trainfit` is the `trainfit` command (src/trainfit/__main__.py): the same output, and exit 2 with one
    line for a bad model, as the installed script gives."""
    ok = subprocess.run([sys.executable, "-m", "trainfit", "estimate", "tiny-llama", "--batch", "1", "--seq", "64"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "tiny-llama" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "trainfit", "estimate", "no-such-model"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr + bad.stdout
