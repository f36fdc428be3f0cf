"""The generated bad-input corpus of the command line (issue 35): every setting of every command that takes it, fed
malformed, negative, zero, NaN, infinite, overflowing, huge and overlong values; every setting in a mode it does not
apply to; every layout flag on every stack; paths, folders, devices and FIFOs for every file-like field; output paths
that cannot be written. Generated from the one list of settings (trainfit.setup.SETTINGS) and the commands' own
options (the typer app), so a new setting or command is covered without a new line here.

Each case runs in-process under a SIGALRM guard (a hang fails the case rather than blocking the suite). Accepted
outcomes: exit 2 with exactly one stderr line starting `error:` that names the flag, and no traceback; or, where a
value is valid, exit 0 with the value visible in the output (never silently dropped).

The hand-written cases beside these are in test_bad_inputs.py (config files, factories, one-off rules).
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import typer

from tests.cli.shared_folder import left_unwritten
from trainfit import stacks
from trainfit.cli import app, main
from trainfit.setup import MODES, SETTINGS

GUARD_S = 10  # a case that takes longer than this is a hang (each refused case takes milliseconds)
COMMANDS = typer.main.get_command(app).commands
OPTIONS = {name: {o for p in c.params for o in p.opts} for name, c in COMMANDS.items()}

# A valid command line per command, cheap to answer (tiny models, no trace): {out} is a path in the test's folder.
BASE = {
    "estimate": ["estimate", "tiny-llama"],
    "compare": ["compare", "tiny-llama"],
    "fit": ["fit", "tiny-llama", "--gpu", "T4"],
    "sweep": ["sweep", "tiny-llama", "--vary", "batch", "1,2"],
    "report": ["report", "tiny-llama", "--no-trace", "-o", "{out}/r.html"],
    "timeline": ["timeline", "tiny-llama", "--seq", "16", "-o", "{out}/t.png"],
    "measure": ["measure", "tiny-llama", "--device", "cpu", "--seq", "16", "--steps", "0"],
    "trace": ["trace", "tests.cli.example_factories:mlp"],
    "plan": ["plan", "tiny-llama", "--gpu", "T4"],
}
# the commands that take a --mode of the settings (plan's --mode is its own: train or serve)
MODE_COMMANDS = [c for c in BASE if "--mode" in OPTIONS[c] and c != "plan"]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {GUARD_S} s")


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `trainfit argv` in-process; a hang raises Hang after GUARD_S seconds."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(GUARD_S)
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_refused(code, out: str, err: str, *names: str) -> str:
    """Exit 2, one stderr line `error: ...` naming one of `names` (a flag, or the value), no traceback."""
    assert code == 2, f"exit {code!r} (expected 2); stdout: {out[-300:]!r}; stderr: {err[-600:]!r}"
    assert "Traceback" not in err + out, err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"stderr must be one error line: {err[-600:]!r}"
    if names:
        assert any(n.lower() in lines[0].lower() for n in names), f"none of {names} in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def fresh_out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # tests.cli.example_factories
    return tmp_path


@pytest.fixture(scope="module")
def _shared_out(tmp_path_factory):
    return tmp_path_factory.mktemp("out")


@pytest.fixture
def out_dir(_shared_out, monkeypatch):
    """An output folder and cwd shared by the module's refused cases (one per xdist worker, not a tmp_path per case:
    ~1,900 cases); each is refused before writing (assert_refused), and a case that wrote into it fails here."""
    monkeypatch.chdir(_shared_out)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # tests.cli.example_factories
    with left_unwritten(_shared_out):
        yield _shared_out


def fill(argv: list[str], out: Path) -> list[str]:
    return [a.replace("{out}", str(out)) for a in argv]


def names_of(s) -> tuple[str, ...]:
    """How an error may name a setting: its flag, aliases and short name (click names '--seq' / '-s')."""
    return (s.flag, *s.meta.aliases, *((s.meta.short,) if s.meta.short else ()))


# -- 1. every setting of every command, bad values -----------------------------------------------------------------
OVERLONG = "9" * 10_000


def bad_values(s) -> list[str]:
    """Values the setting must refuse, from its type and bounds."""
    m, t = s.meta, s.base_type
    if t is bool:
        return []  # a switch takes no value (see test_switch_takes_no_value)
    common = ["abc", "", "1,2", "é", "x" * 10_000]
    if t is int:
        out = common + ["0x10", "1.5", "-1", "nan", "inf", "-inf", "1e400", *([str(int(m.maximum) + 1)] if m.maximum is not None else []), str(10**30),
                        OVERLONG]  # (every integer setting has a maximum or choices: tests/cli/test_bounded_work.py)
        if m.choices is None and (m.minimum or 0) >= 1:
            out.append("0")
        return out
    if t is float:
        out = common + ["0x10", "-1", "nan", "inf", "-inf", "1e400", "-1e400", OVERLONG]
        if m.above is not None:
            out += ["0", "1e-400"]  # (1e-400 is 0.0 in a float)
        if m.maximum is not None:
            out += [str(10**30), repr(m.maximum * 1.5)]
        return out
    if m.choices is not None:  # a choice: any other word, another case, another setting's word
        spaced = [] if m.repeatable else [" " + str(m.choices[0])]  # (a repeatable flag's list strips its items)
        return common + ["1", str(m.choices[0]).upper() + "X", *spaced]
    return ["", "x" * 10_000, "é"] + FREE_TEXT_BAD.get(s.name, [])


# the free-text settings' own malformed values (their `check` or their loader refuses them)
FREE_TEXT_BAD = {
    "recompute": ["layer:0", "layer:x", "uniform:", "full:2", "none,full"],
    "pp_split": ["first:x", "first:0", "middle:3", "first:2,,last"],
    "lora_targets": ["q proj", "q_proj;v_proj", ","],
    "alloc_conf": ["expandable_segments", "max_split_size_mb:-1", "a:b:c", "max_split_size_mb:nan"],
    "gpu": ["H900", "abc"],
    "draft_model": ["no-such-model"],
    "critic_model": ["no-such-model"],
    "reward_model": ["no-such-model"],
}

# Context a setting needs before its value is read (its mode, a GPU for serving), per setting.
SERVE = ["--mode", "serve", "--gpu", "H100-80GB"]
CONTEXT = {s.name: (SERVE if s.meta.modes == ("serve",) else ["--mode", "rl"] if s.meta.modes == ("rl",)
                    else ["--mode", "infer"] if "train" not in s.meta.modes else [])
           for s in SETTINGS}
CONTEXT.update(critic_model=["--mode", "rl", "--rl-algo", "ppo"], mfu=["--gpu", "T4"], tokens=["--gpu", "T4"], price=["--gpu", "T4", "--tokens", "1e9"], gpu_memory=["--gpu", "T4"],
               reserve=["--gpu", "T4"])


def _value_cases():
    """A full battery per setting on estimate; a thinner one on every other command taking the setting (the same
    parser, so three values each: malformed, out of bounds, overlong)."""
    for s in SETTINGS:
        values = bad_values(s)
        for cmd in BASE:
            if s.flag not in OPTIONS[cmd]:
                continue
            context = CONTEXT[s.name]
            if "--mode" in context and cmd != "estimate":
                continue  # a setting of another mode: its parser is the same on every command (estimate's battery)
            if cmd in ("plan", "fit") and "--gpu" in context:  # their --gpu is in their base
                context = []
            chosen = values if cmd == "estimate" else [v for v in values if v in ("abc", "-1", "x" * 10_000,
                                                                                  OVERLONG)][:3] or values[:2]
            for v in chosen:
                yield pytest.param(cmd, [*context, f"{s.flag}={v}"] if v.startswith("-") else [*context, s.flag, v],
                                   s.name, id=f"{cmd}-{s.name}-{v[:12] or 'empty'}{'...' if len(v) > 12 else ''}")


VALUE_CASES = list(_value_cases())


@pytest.mark.parametrize("cmd,args,name", VALUE_CASES)
def test_bad_value_is_refused(out_dir, capsys, cmd, args, name):
    s = next(x for x in SETTINGS if x.name == name)
    code, out, err = run(capsys, fill(BASE[cmd], out_dir) + args)
    value = args[-1].split("=", 1)[-1] if args[-1].startswith(s.flag + "=") else args[-1]
    assert_refused(code, out, err, *names_of(s), *((value[:20],) if value.strip() else ()))


SWITCHES = [s for s in SETTINGS if s.base_type is bool]


@pytest.mark.parametrize("name", [s.name for s in SWITCHES])
def test_switch_takes_no_value(capsys, name):
    s = next(x for x in SETTINGS if x.name == name)
    code, out, err = run(capsys, ["estimate", "tiny-llama", f"{s.flag}=maybe"])
    assert_refused(code, out, err, s.flag)


# -- 2. a setting in a mode it does not apply to ------------------------------------------------------------------
def example_args(s) -> list[str]:
    """The setting given a valid value other than its default."""
    if s.base_type is bool:
        return [s.flag]
    if s.meta.example and s.meta.example != str(s.default):
        return [s.flag, s.meta.example]
    if s.meta.choices:
        return [s.flag, str(next(c for c in s.meta.choices if c != s.default))]
    return [s.flag, str(s.default * 2)]  # a number whose example is its default


INAPPLICABLE = [pytest.param(s.name, mode, id=f"{s.name}-in-{mode}") for s in SETTINGS for mode in MODES
                if mode not in s.meta.modes]


@pytest.mark.parametrize("name,mode", INAPPLICABLE)
def test_setting_outside_its_modes_is_refused(capsys, name, mode):
    s = next(x for x in SETTINGS if x.name == name)
    code, out, err = run(capsys, ["estimate", "llama-3.1-8b", "--mode", mode, "--gpu", "H100-80GB",
                                  *example_args(s)])
    line = assert_refused(code, out, err, s.flag)
    assert "/".join(s.meta.modes) in line or "appl" in line, line


@pytest.mark.parametrize("cmd", MODE_COMMANDS)
def test_every_command_with_modes_refuses_inapplicable_settings(out_dir, capsys, cmd):
    """One case per command: the same refusal (Request's validation) reaches every command that takes --mode."""
    code, out, err = run(capsys, fill(BASE[cmd], out_dir) + ["--mode", "infer", "--optimizer", "sgd"])
    assert_refused(code, out, err, "--optimizer", "answers for training")  # (fit refuses --mode infer first)


# -- 3. layouts a stack cannot run ---------------------------------------------------------------------------------
# each layout flag with what it needs around it (a divisible model, dp ranks for ZeRO, a pipeline's micro-batches)
LAYOUTS = {
    "--tp": ["--tp", "2"],
    "--pp": ["--pp", "2", "--grad-accum", "4"],
    "--vpp": ["--pp", "2", "--vpp", "2", "--grad-accum", "4"],
    "--pp-split": ["--pp", "2", "--pp-split", "embedding-loss", "--grad-accum", "4"],
    "--cp": ["--cp", "2"],
    "--ep": ["--ep", "2", "--dp", "2"],
    "--etp": ["--ep", "2", "--etp", "1", "--tp", "2", "--dp", "2"],
    "--moe-dispatcher": ["--ep", "4", "--dp", "4", "--moe-dispatcher", "allgather"],  # (ep 2, top-2: the same bytes)
    "--overlap-moe-comm": ["--ep", "2", "--dp", "2", "--grad-accum", "4", "--overlap-moe-comm"],
    "--sequence-parallel": ["--tp", "2", "--sequence-parallel"],
    "--zero": ["--zero", "2", "--dp", "2"],
    "--offload": ["--offload", "optimizer", "--zero", "1", "--dp", "2"],
    "--compile": ["--compile"],
    "--low-precision": ["--low-precision", "tensorwise"],
    "--quant": ["--quant", "nf4", "--lora-rank", "8"],
    "--lora-rank": ["--lora-rank", "8"],
    "--loss": ["--loss", "fused-linear"],
    "--optimizer-in-backward": ["--optimizer-in-backward"],
    "--attention": ["--attention", "triton"],
    "--recompute": ["--recompute", "selective", "--attention", "eager"],
}
MOE_FLAGS = ("--ep", "--etp", "--moe-dispatcher", "--overlap-moe-comm")
STACK_CASES = [pytest.param(stack, flag, id=f"{stack}{flag}") for stack in stacks.names() for flag in LAYOUTS]


def _estimate_json(capsys, argv):
    code, out, err = run(capsys, argv + ["--json"])
    return code, (json.loads(out) if code == 0 else None), out, err


@pytest.mark.parametrize("stack,flag", STACK_CASES)
def test_layout_flag_is_run_by_the_stack_or_refused(capsys, stack, flag):
    """A layout flag on a stack: refused by name, or run, and then it changes the estimate (never ignored)."""
    model = "mixtral-8x7b" if flag in MOE_FLAGS else "llama-3.1-8b"
    base = ["estimate", model, "--stack", stack, "--gpu", "H100-80GB"]
    extra = LAYOUTS[flag]
    code, with_flag, out, err = _estimate_json(capsys, base + extra)
    if code != 0:
        assert_refused(code, out, err, flag, *extra)
        return
    context = [a for i, a in enumerate(extra) if a != flag and not (i > 0 and extra[i - 1] == flag)]
    code0, without, out0, err0 = _estimate_json(capsys, base + context)
    if code0 != 0:
        return  # the flag is what makes the layout valid (e.g. --vpp's chunks): it reached the setup
    assert with_flag["memory"] != without["memory"] or with_flag.get("time") != without.get("time"), \
        f"{flag} on --stack {stack} accepted but changed nothing: {' '.join(extra)}"


# -- 4. paths, folders, devices and binary files for every file-like field ------------------------------------------
@pytest.fixture
def bad_files(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "binary.json").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "empty.json").write_bytes(b"")
    return {
        "dev-zero": "/dev/zero", "dev-urandom": "/dev/urandom", "dev-null": "/dev/null",
        "proc-environ": "/proc/self/environ", "fifo": str(fifo), "folder": str(tmp_path / "folder.json"),
        "empty-folder": str(tmp_path / "empty-folder"), "binary": str(tmp_path / "binary.json"),
        "empty": str(tmp_path / "empty.json"), "long-name": str(tmp_path / ("m" * 300 + ".json")),
        "long-path": "/".join(["d" * 200] * 30) + ".json", "missing": str(tmp_path / "missing.json"),
        "root": "/",
    }


FILE_KINDS = ["dev-zero", "dev-urandom", "dev-null", "proc-environ", "fifo", "folder", "empty-folder", "binary",
              "empty", "long-name", "long-path", "missing", "root"]
# (the field, the command line around it; {path} is the bad path)
FILE_FIELDS = {
    "model": ["estimate", "{path}"],
    "gpu": ["estimate", "tiny-llama", "--gpu", "{path}"],
    "draft_model": ["estimate", "llama-3.1-8b", *SERVE, "--draft-model", "{path}"],
    "critic_model": ["estimate", "qwen2.5-0.5b", "--mode", "rl", "--rl-algo", "ppo", "--critic-model", "{path}"],
    "reward_model": ["estimate", "qwen2.5-0.5b", "--mode", "rl", "--reward-model", "{path}"],
    "plan-model": ["plan", "{path}", "--gpu", "T4"],
    "plan-gpu": ["plan", "tiny-llama", "--gpu", "{path}"],
}
FILE_CASES = [pytest.param(field, kind, id=f"{field}-{kind}") for field in FILE_FIELDS for kind in FILE_KINDS]


@pytest.mark.parametrize("field,kind", FILE_CASES)
def test_bad_path_is_refused(capsys, bad_files, field, kind):
    path = bad_files[kind]
    argv = [a.replace("{path}", path) for a in FILE_FIELDS[field]]
    code, out, err = run(capsys, argv)
    assert_refused(code, out, err)


# output paths: a folder, a missing folder, a read-only place, a name too long, a device, the wrong extension
def _outputs(tmp: Path) -> dict[str, str]:
    (tmp / "taken").mkdir(exist_ok=True)
    for ext in ("html", "png"):
        os.mkfifo(tmp / f"fifo.{ext}")  # writing to a FIFO nobody reads blocks
    return {"folder": str(tmp / "taken"), "missing-dir": str(tmp / "no" / "such" / "x.{ext}"),
            "read-only": "/proc/x.{ext}", "long-name": str(tmp / ("o" * 300 + ".{ext}")),
            "dev-full": "/dev/full", "fifo": str(tmp / "fifo.{ext}"), "no-extension": str(tmp / "picture"), "wrong-extension": str(tmp / "x.exe")}


OUTPUT_COMMANDS = {  # the command, and the extension it writes
    "report": (["report", "tiny-llama", "--no-trace"], "html"),
    "timeline": (["timeline", "tiny-llama", "--seq", "16"], "png"),
    "sweep": (["sweep", "tiny-llama", "--vary", "batch", "1,2"], "png"),
}
OUTPUT_CASES = [pytest.param(cmd, kind, id=f"{cmd}-{kind}") for cmd in OUTPUT_COMMANDS
                for kind in ("folder", "missing-dir", "read-only", "long-name", "dev-full", "fifo",
                             "no-extension", "wrong-extension") if not (cmd == "report" and kind in ("no-extension",))]


@pytest.mark.parametrize("cmd,kind", OUTPUT_CASES)
def test_unwritable_output_is_refused(fresh_out_dir, capsys, cmd, kind):
    argv, ext = OUTPUT_COMMANDS[cmd]
    path = _outputs(fresh_out_dir)[kind].replace("{ext}", ext)
    code, out, err = run(capsys, argv + ["-o", path])
    assert_refused(code, out, err)


# -- 5. a valid flag a command does not read: refused, never silently dropped ----------------------------------------
# The run settings (the question's, not the step's) with a valid value, on every command taking them: the answer
# must change (the value reached it) or the flag be refused by name. The step's settings reach the estimate's setup,
# which every command prints; these do not, so each command must use them or refuse them.
RUN_VALUES = {"gpu": ["--gpu", "A100-80GB"], "gpu_memory": ["--gpu-memory", "10"], "mfu": ["--mfu", "0.3"],
              "tokens": ["--tokens", "1e9"], "price": ["--price", "7"], "reserve": ["--reserve", "3"],
              "alloc_conf": ["--alloc-conf", "max_split_size_mb:20"], "power_limit": ["--power-limit", "50"]}
RUN_CONTEXT = {"price": ["--tokens", "1e9"]}  # (given to both runs, where the command takes it)
JSON_BASE = {  # the commands that print JSON (their answers compared), each with a GPU (the run settings need one)
    "estimate": ["estimate", "tiny-llama", "--gpu", "T4", "--json"],
    "compare": ["compare", "tiny-llama", "--gpu", "T4", "--json"],
    "fit": ["fit", "tiny-llama", "--gpu", "T4", "--json"],
    "sweep": ["sweep", "tiny-llama", "--vary", "batch", "1,2", "--gpu", "T4", "--json"],
    "plan": ["plan", "tiny-llama", "--gpu", "T4", "--json"],
}
IGNORED_CASES = [pytest.param(cmd, name, id=f"{cmd}-{name}") for cmd in JSON_BASE for name in RUN_VALUES]


@pytest.mark.parametrize("cmd,name", IGNORED_CASES)
def test_run_setting_is_used_or_refused(capsys, cmd, name):
    context = [a for a in RUN_CONTEXT.get(name, []) if RUN_CONTEXT[name][0] in OPTIONS[cmd]]
    base, args = JSON_BASE[cmd] + context, RUN_VALUES[name]
    code0, out0, err0 = run(capsys, base)
    assert code0 == 0, err0
    code, out, err = run(capsys, base + args)
    if code != 0:
        assert_refused(code, out, err, args[0])
        return
    assert out != out0, f"{' '.join(args)} accepted by {cmd} but the answer is the same as without it"


@pytest.mark.parametrize("args", [["--engine", "analytic", "--alloc-conf", "max_split_size_mb:128"],
                                  ["--engine", "analytic", "--mode", "infer"],
                                  ["--measure", "--device", "cpu", "--seq", "16"]],
                         ids=["analytic-max-split", "analytic-infer", "measure"])
def test_alloc_conf_needs_an_engine_that_reads_it(capsys, args):
    code, out, err = run(capsys, ["estimate", "tiny-llama", "--alloc-conf", "expandable_segments:True", *args])
    assert_refused(code, out, err, "--alloc-conf")


def test_corpus_size():
    """At least the issue's 569 command lines (generated: it grows with the settings)."""
    n = (len(VALUE_CASES) + len(SWITCHES) + len(INAPPLICABLE) + len(MODE_COMMANDS) + len(STACK_CASES)
         + len(FILE_CASES) + len(OUTPUT_CASES) + len(IGNORED_CASES))
    assert n >= 569, n


@pytest.mark.parametrize("argv,flag", [
    (["plan", "tiny-llama", "--gpu", "T4", "--batch-tolerance", "0.2"], "--batch-tolerance"),
    (["report", "tiny-llama", "--no-trace", "--alloc-conf", "expandable_segments:True", "-o", "r.html"],
     "--alloc-conf"),
    (["estimate", "tiny-llama", "--offload", ""], "--offload"),
], ids=["plan-tolerance-without-batch", "report-alloc-conf-without-trace", "offload-empty"])
def test_option_the_command_would_not_read_is_refused(out_dir, capsys, argv, flag):
    code, out, err = run(capsys, argv)
    assert_refused(code, out, err, flag)
