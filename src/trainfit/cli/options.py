"""CLI options generated from the one list of settings (trainfit.setup.SETTINGS), so that a flag means the same
thing, with the same help, default and validation, in every command.

A command is written as `def cmd(req: Request, <its own options>)` and decorated with `@with_settings(...)`: the
decorator gives it the model argument and one option per setting, builds the `Request` (which validates every
value once) and calls the command with it.
"""
from __future__ import annotations

import copy
import functools
import inspect
import re
import typing
from collections.abc import Mapping
from typing import Any, Callable, Optional

import click
import typer
import typer.core
import typer.main

try:  # typer 0.29 (read at 0.29.2; pyproject allows >= 0.12) coerces each parameter through a pydantic TypeAdapter
    from typer._coercion import RuntimeParam as _RuntimeParam
    from typer._coercion import build_runtime_param as _build_runtime_param
except ImportError:  # a typer without typer/_coercion.py coerces with click's types: nothing to defer
    _RuntimeParam = None
try:  # typer 0.29 runs its own copy of click (typer/_click), whose context is not click's
    from typer._click.globals import get_current_context
except ImportError:
    from click import get_current_context

from ..setup import SETTINGS, Request, Setting, parse_value, refuse_written
from ..setup.vocab import GROUPS, MODES

ModelArg = typer.Argument(..., help="Catalog name (see `trainfit models`), a config.json or folder holding one, or a cached hub id org/name.")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object instead of tables.")
EngineOpt = typer.Option("analytic", "--engine", help="analytic (formulas, instant), trace (fake-tensor run of the real model), measure (real run here), all.")


if _RuntimeParam is not None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class _DeferredCoercion(_RuntimeParam):
        """A parameter's coercion, built only for a value that needs it.

        Why: typer 0.29 builds each parameter's pydantic TypeAdapter on its first `process_value`
        (typer/core.py:100-109, `_TyperParameter.get_runtime_param` -> `_coercion.build_runtime_param`, which
        imports typer/_adapters.py and so pydantic), and click processes every parameter of the invoked command,
        given or not: `trainfit estimate` has ~90 options, most left at None or at their default. Building all
        their adapters and importing pydantic cost ~0.3 s of a ~1.3 s estimate. Here None never reaches
        `_coerce_value` (the base class `RuntimeParam.coerce` returns first, typer/_coercion.py:137-145, as with
        typer's own); a value whose type is exactly the parameter's plain str/int/float annotation (a str typed on
        the command line, an int or float default) is returned as is, which is what typer's adapter returns for
        it: str is `TypeAdapter(Annotated[str, BeforeValidator(_parse_cli_str)])` with `_parse_cli_str` =
        `str(value)`, and a number without min/max is `TypeAdapter(int|float)`, which keeps an exact int/float
        (typer/_adapters.py:143-156,185-201,216-240); any other value (e.g. "4" for an int) goes to the adapter
        typer would have built (then cached, as `get_runtime_param` caches its own)."""

        descriptor: Any = None

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            d, info = self.descriptor, self.parameter_info
            if type(value) is d.annotation and d.annotation in (str, int, float) and info.parser is None \
                    and info.min is None and info.max is None and d.file_annotation is None:
                return value
            param._runtime_param = _build_runtime_param(d)
            return param._runtime_param._coerce_value(value, param=param, ctx=ctx)


def _defer_coercion(params: list) -> None:
    for p in params:
        if _RuntimeParam is not None and getattr(p, "_runtime_param", 0) is None and hasattr(p, "type_descriptor"):
            d = p.type_descriptor
            p._runtime_param = _DeferredCoercion(parameter_info=d.parameter_info, annotation=d.annotation,
                                                 descriptor=d)


class DeferredCoercion:
    """Mixin for typer's command and group classes: their parameters, the help option included (created on
    first use, typer/_click/core.py:597-616), coerce through `_DeferredCoercion`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _defer_coercion(self.params)

    def get_help_option(self, ctx: click.Context) -> Any:
        option = super().get_help_option(ctx)
        _defer_coercion([option] if option is not None else [])
        return option


class Group(DeferredCoercion, typer.core.TyperGroup):
    """The CLI's group (typer.Typer(cls=Group)): typer's, with deferred coercion, and (from `lazy_group`) its
    commands built when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # typer's reads .items(), which would build every command (same names, order)


class LazyCommands(Mapping):
    """A group's commands by name, each built by typer (typer.main.get_command_from_info) on first access.

    Why: typer.main.get_group_from_info (typer/main.py:1272-1290) builds every registered command, its ~30-90
    options each read from the function's signature (typer/utils.py get_params_from_function, main.py _get_param),
    before parsing: ~70 ms for the CLI's 14 commands, when one runs. The names and their order are typer's (the
    command's name or its function's, main.py:1374; a later registration of a name replaces the earlier)."""

    def __init__(self, infos: list, build: Callable[[Any], click.Command]) -> None:
        self._infos = {info.name or typer.main.get_command_name(info.callback.__name__): info for info in infos}
        self._built: dict[str, click.Command] = {}
        self._build = build

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._built:
            self._built[name] = self._build(self._infos[name])
        return self._built[name]

    def __iter__(self):
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)


def lazy_group(app: typer.Typer) -> Group:
    """typer.main.get_command(app) for an app of commands only (no sub-typers), its commands built on first use."""
    assert not app.registered_groups and app.info.cls is Group, "lazy_group builds a Group of commands only"
    shell = copy.copy(app)
    shell.registered_commands = []
    group = typer.main.get_group(shell)
    group.commands = LazyCommands(app.registered_commands, functools.partial(
        typer.main.get_command_from_info, pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode))
    return group


class GroupedCommand(DeferredCoercion, typer.core.TyperCommand):
    """A command whose --help lists the settings under their concern's heading (setup.vocab.GROUPS: the step,
    parallelism, fine-tuning, serving, RL, vision, the GPU and the budget), then the command's own options, one line
    each (its help's first sentence); --help-all gives each its whole description. (typer draws such sections,
    rich_help_panel, only through rich's formatter, which the CLI leaves off.)"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.context_settings.setdefault("max_content_width", HELP_WIDTH)
        self.params.append(_eager_flag("--help-all", _help_all, "Show every option's whole description and exit."))
        _defer_coercion(self.params[-1:])  # (as DeferredCoercion does the others')

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        group_of = {s.name: s.meta.group for s in SETTINGS}
        arguments, sections = [], {title: [] for title, _ in GROUPS.values()}
        own = sections.setdefault("Options", [])
        whole = ctx.meta.get(HELP_ALL, False)
        room = formatter.width - formatter.current_indent - 2 * HELP_INDENT - HELP_FLAGS  # (click's write_dl)
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if not whole:
                record = (record[0], first_sentence(record[1], room))
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                group = group_of.get(param.name)
                (sections[GROUPS[group][0]] if group else own).append(record)
        for title, records in (("Arguments", arguments), *sections.items()):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


HELP_ALL = "trainfit.help_all"  # ctx.meta: --help-all asked for (each option's whole description)
HELP_FLAGS, HELP_INDENT = 30, 2  # click's HelpFormatter.write_dl: the flags' column (col_max), its spacing
HELP_WIDTH = 120  # columns --help may use on a wide terminal (click's default stops at 80)


def _help_all(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--help-all: the command's help with every option's whole description."""
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


def _eager_flag(name: str, callback: Callable, help: str):
    """A flag that acts when parsed and takes no part in the command's call, as --help is built (typer 0.29's own
    click copy, typer/_click/decorators.py help_option: a TyperOption; click's Option before it)."""
    try:
        from typer._coercion import bool_flag_type_descriptor
    except ImportError:
        return click.Option([name], is_flag=True, expose_value=False, is_eager=True, callback=callback, help=help)
    return typer.core.TyperOption(param_decls=[name], is_flag=True, expose_value=False, is_eager=True, required=False,
                                  callback=callback, help=help, type_descriptor=bool_flag_type_descriptor())


# A sentence's end: a full stop and a space, not an abbreviation's ("e.g. 15T" is one sentence going on)
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\bcf)\. ")


def first_sentence(text: str, room: int) -> str:
    """An option's help in one line of `room` characters: its first sentence (cut at a word with '…'), and click's
    [default: …] where it fits."""
    tail = ""
    if text.endswith("]") and "  [" in text:
        text, tail = text.rsplit("  [", 1)
        tail = "  [" + tail
    head = _SENTENCE_END.split(text, 1)[0].rstrip(".")
    if len(head) + len(tail) <= room:
        return head + tail
    if len(head) > room:
        head = head[:room - 1].rsplit(" ", 1)[0].rstrip(",;:(") + "…"
    return head


def _help(s: Setting) -> str:
    h = s.meta.help
    if s.meta.choices and s.name != "precision" and "choose" not in h and not all(str(c) in h for c in s.meta.choices):
        h += f" One of: {', '.join(map(str, s.meta.choices))}."
    if s.meta.auto:
        h += f" Default: {s.meta.auto}."
    if tuple(s.meta.modes) != ("train", "infer"):
        h += f" ({'/'.join(s.meta.modes)} only)"
    return h


def option(s: Setting, default: Any = inspect.Parameter.empty, help: str | None = None) -> tuple[Any, Any]:
    """(annotation, typer.Option) of one setting; `default`/`help` override the declared ones for a command."""
    d = s.request_default if default is inspect.Parameter.empty else default
    t = s.base_type
    if s.meta.parse is not None:
        t = str  # parsed by the setting's own parser (e.g. counts with suffixes)
    names = [s.flag] + list(s.meta.aliases) + ([s.meta.short] if s.meta.short else [])
    if s.meta.repeatable:  # typer collects every occurrence; parse_value combines them
        return Optional[list[str]], typer.Option(None, *names, help=help or _help(s), show_default=False,
                                                 metavar="<str>")
    annotation = Optional[t] if d is None and t is not bool else t
    return annotation, typer.Option(d, *names, help=help or _help(s), show_default=d is not None and not s.meta.auto)


def with_settings(only: tuple[str, ...] | None = None, exclude: tuple[str, ...] = (), model: bool = True,
                  defaults: dict[str, Any] | None = None, helps: dict[str, str] | None = None,
                  mode: str | None = None) -> Callable:
    """Decorate `fn(req, **own)`: add the model argument (unless model=False) and the settings' options; `mode`: a
    command that runs in that mode only offers the settings it reads (its --help lists no option it would refuse)."""
    defaults, helps = defaults or {}, helps or {}
    chosen = [s for s in SETTINGS if (only is None or s.name in only) and s.name not in exclude
              and (mode is None or mode in s.meta.modes)]

    def decorate(fn: Callable) -> Callable:
        own = list(inspect.signature(fn).parameters.values())[1:]  # the first parameter receives the Request
        hints = typing.get_type_hints(fn)  # resolved in fn's module (string annotations)
        params, annotations = [], {}
        if model:
            params.append(inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=ModelArg,
                                            annotation=str))
            annotations["model"] = str
        for s in chosen:
            ann, opt = option(s, defaults.get(s.name, inspect.Parameter.empty), helps.get(s.name))
            params.append(inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann))
            annotations[s.name] = ann
        for p in own:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            if p.name in hints:
                annotations[p.name] = hints[p.name]

        @functools.wraps(fn)
        def command(**kwargs):
            values = {s.name: parse_value(s, kwargs.pop(s.name)) for s in chosen}
            req = Request(model=kwargs.pop("model") if model else "-", **values)
            if req.mode in MODES:  # a flag written at its default value is refused too where it does not apply
                refuse_written(written(chosen), req.mode, req.rollout, req.server)
            return fn(req, **kwargs)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = annotations
        del command.__wrapped__  # typer must read the generated signature, not fn's
        return command

    return decorate


def written(settings: list[Setting]) -> frozenset:
    """The names of `settings` the user wrote on the command line (click's parameter source), whatever their value:
    the Request sees only values, and a flag at its default looks unwritten there."""
    return written_params(s.name for s in settings)


def written_params(names) -> frozenset:
    """Of the command's parameters `names`, those written on the command line (click's parameter source)."""
    ctx = get_current_context(silent=True)
    if ctx is None:
        return frozenset()
    source = ctx.get_parameter_source
    return frozenset(n for n in names if getattr(source(n), "name", None) == "COMMANDLINE")
