"""`--help` lists the settings under their concern's heading (setup.vocab.GROUPS), each flag once, the command's own
options last: a user looking for the serving flags finds them under "Serving", not among 100 others."""
from __future__ import annotations

import re

from typer.testing import CliRunner

from trainfit.cli.app import app
from trainfit.setup import SETTINGS
from trainfit.setup.vocab import GROUPS


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_estimate_help_groups_each_setting_under_its_concern():
    result = CliRunner().invoke(app, ["estimate", "--help"], terminal_width=200)
    assert result.exit_code == 0
    sections = _sections(result.output)
    titles = [title for title, _ in GROUPS.values()]
    assert [t for t in sections if t in titles] == titles  # every group, in GROUPS order
    assert list(sections)[-1] == "Options" and "--json" in sections["Options"] and "--engine" in sections["Options"]
    for s in SETTINGS:
        row = re.compile(rf"^  (-\w, )?{re.escape(s.flag)}[\s,]", re.M)  # the option's own row, not a mention
        where = [t for t, body in sections.items() if row.search(body)]
        assert where == [GROUPS[s.meta.group][0]], (s.flag, where)


def test_a_command_with_few_settings_shows_only_their_groups():
    result = CliRunner().invoke(app, ["plan", "--help"], terminal_width=200)
    sections = _sections(result.output)
    assert "RL post-training (--mode rl)" not in sections and "Parallelism" in sections


def test_compare_offers_only_the_training_settings_it_reads():
    """compare runs --mode train (and derives its inference): an option of another mode only would be refused, so
    its --help does not list it; every training setting it takes is there."""
    result = CliRunner().invoke(app, ["compare", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for s in SETTINGS:
        row = re.compile(rf"^  (-\w, )?{re.escape(s.flag)}[\s,]", re.M)
        listed = bool(row.search(result.output))
        assert listed == ("train" in s.meta.modes and s.name not in ("mode", "tokens", "mfu", "price", "alloc_conf")), s.flag


def test_help_is_one_line_per_option_and_help_all_has_each_whole():
    """--help teaches in few lines (each option's first sentence, one line at 80 columns); --help-all has every
    option's whole description (the precision policies' list, the defaults)."""
    short = CliRunner().invoke(app, ["estimate", "--help"], terminal_width=80)
    whole = CliRunner().invoke(app, ["estimate", "--help-all"], terminal_width=80)
    assert short.exit_code == 0 and whole.exit_code == 0
    assert max(map(len, short.output.splitlines())) <= 80
    flags = [s for s in SETTINGS if re.search(rf"^  (-\w, )?{re.escape(s.flag)}[\s,]", short.output, re.M)]
    assert len(flags) == len(SETTINGS)
    assert len(short.output.splitlines()) < 1.3 * len(SETTINGS) + 60 < len(whole.output.splitlines()) / 3
    assert "bf16-master (bf16 weights and grads" in " ".join(whole.output.split())
    assert "bf16-master (bf16" not in short.output and "--help-all" in short.output


def test_each_option_names_each_of_its_flags_once():
    """An alias is another name (an engine's own flag, a short form), never the flag again: `--help` printed
    '--overlap-param-gather, --overlap-param-gather' when a setting listed its own flag as its alias."""
    result = CliRunner().invoke(app, ["estimate", "--help"], terminal_width=200)
    for s in SETTINGS:
        names = [s.flag, *s.meta.aliases, *([s.meta.short] if s.meta.short else [])]
        assert len(set(names)) == len(names), names
    assert not re.search(r"^  (--[\w-]+), \1(?![\w-])", result.output, re.M)


def test_a_first_sentence_runs_past_an_abbreviation():
    """--help's one line is the option's first sentence: "(e.g. 15T)" goes on (it printed "Training budget in tokens
    (e.g" and "Tokens per optimizer step (e.g"); a real full stop still ends it."""
    result = CliRunner().invoke(app, ["plan", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert re.search(r"^  --tokens <str> +Training budget in tokens \(e\.g\. 15T\): time, GPU-hours, cost and energy "
                     r"per plan$", result.output, re.M)
    assert re.search(r"^  --global-batch-tokens <str> +Tokens per optimizer step \(e\.g\. 4M\); micro-batch", result.output,
                     re.M)
    assert not re.search(r"\((e\.g|i\.e)$", result.output, re.M)
    assert re.search(r"^  --gpus <int> +Number of GPUs; every plan uses all of them \(dp × tp × pp × cp = gpus\)  "
                     r"\[default: 1\]$", result.output, re.M)


def _option_help(command: list[str], flag: str) -> str:
    """The whole --help-all description of `flag` under `command`, on one line."""
    out = CliRunner().invoke(app, [*command, "--help-all"], terminal_width=200).output
    m = re.search(rf"^  (?:-\w, )?(?:--[\w-]+, )*{re.escape(flag)}[ ,].*?(?=^  -|^\S|\Z)", out, re.M | re.S)
    assert m, flag
    return " ".join(m.group(0).split())


def _run(capsys, args: list[str]) -> tuple[int, str]:
    """(exit code, stdout + stderr) of the trainfit command `args`, as the console script runs it."""
    from trainfit.cli.app import main

    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out + out.err


def test_price_help_says_the_modes_that_take_it(capsys):
    """--price's help said "(plan --mode serve: of the replicas). (train only)" in `estimate`, which refuses it with
    --mode serve. Now estimate's help claims train only, as its behaviour does; plan's help says what --price does
    with --mode serve, and plan --mode serve does price its replicas by it."""
    import json

    estimate = _option_help(["estimate"], "--price")
    assert "(train only)" in estimate and "--mode serve" not in estimate, estimate
    code, out = _run(capsys, ["estimate", "tiny-llama", "--mode", "serve", "--gpu", "H100-80GB", "--price", "2"])
    assert code == 2 and "--price applies to train only" in out, out
    plan = _option_help(["plan"], "--price")
    assert "--mode serve" in plan and "(train only)" not in plan, plan
    best = []
    for extra in ([], ["--price", "100"]):
        code, out = _run(capsys, ["plan", "tiny-llama", "--mode", "serve", "--gpu", "H100-80GB", "--concurrency", "8",
                                  "--json", *extra])
        assert code == 0, out
        best.append(json.loads(out)["plans"][0])
    assert best[0]["price_per_hour"] != best[1]["price_per_hour"] == 100 * best[1]["gpus"], best


def test_kv_cache_dtype_help_says_which_modes_take_which(capsys):
    """--kv-cache-dtype listed fp32 and int8 for every mode, and --mode serve refuses them. The help's serve list is
    what `estimate --mode serve` takes (vLLM and SGLang), its infer list what --mode infer takes."""
    from trainfit.setup.vocab import KV_DTYPES

    text = _option_help(["estimate"], "--kv-cache-dtype")
    lists = {mode: re.search(rf"(\w+(?:, \w+)*) with --mode {mode}", text).group(1).split(", ")
             for mode in ("infer", "serve")}
    assert sorted(lists["infer"]) == sorted(KV_DTYPES) and set(lists["serve"]) < set(KV_DTYPES), text
    for dtype in KV_DTYPES:
        for server, precision in (("vllm", "bf16"), ("sglang", "fp16")):  # (SGLang: fp16 as the model's only)
            code, out = _run(capsys, ["estimate", "tiny-llama", "--mode", "serve", "--gpu", "H100-80GB", "--server",
                                      server, "--precision", precision, "--kv-dtype", dtype])
            assert (code == 0) == (dtype in lists["serve"]), (server, dtype, out)
        code, out = _run(capsys, ["estimate", "tiny-llama", "--mode", "infer", "--kv-dtype", dtype])
        assert code == 0, (dtype, out)


def test_plan_stack_help_says_what_each_stack_searches():
    """plan --stack's help names, for each stack, the recompute policies, ZeRO stages, precisions and settings the
    search itself records as searched (PlanResult.stats["stacks"]); it had said megatron searches 'the distributed
    optimizer (ZeRO 0/1)' while its search covers ZeRO 0-3 (Megatron-FSDP), experts and dispatchers."""
    import json

    helped = CliRunner().invoke(app, ["plan", "--help-all"], terminal_width=2000)
    text = " ".join(helped.output.split())
    got = CliRunner().invoke(app, ["plan", "llama-3.2-1b", "--gpu", "H100-80GB", "--gpus", "8", "--stacks",
                                   "hf,torchtitan,megatron,deepspeed", "--json"])
    assert got.exit_code == 0, got.output
    for stack, d in json.loads(got.output)["search"]["stacks"].items():
        said = re.search(rf"; {stack} recompute ([^;.]*)", text.replace("(stacks/*.toml): ", "; ")).group(1)
        assert said.startswith(", ".join(d["recomputes"]) + ", ZeRO " + ", ".join(map(str, d["zeros"]))
                               + ", precision " + ", ".join(d["precisions"])), (stack, said)
        for axis in d["axes"]:
            assert axis.replace("_", "-") in said, (stack, axis, said)
    assert "ZeRO 0/1" not in text


def test_an_fp32_model_serves_with_its_own_kv_dtype(capsys):
    """vLLM and SGLang cache KV in the model's dtype under their default "auto" (vLLM config/cache.py CacheDType):
    `estimate --mode serve --precision fp32` was refused as '--kv-cache-dtype fp32', a flag never written (and plan
    --mode serve --precision fp32 --emit vllm likewise); the fp32 KV is sized (4 bytes per element: twice bf16's),
    and an fp32 KV beside 16-bit weights stays refused."""
    import json

    args = ["estimate", "tiny-llama", "--mode", "serve", "--gpu", "H100-80GB", "--json"]
    code, out = _run(capsys, [*args, "--precision", "fp32"])
    assert code == 0, out
    fp32 = json.loads(out)["detail"]["serving"]["kv_bytes_per_token"]
    code, out = _run(capsys, [*args, "--precision", "bf16"])
    assert code == 0 and fp32 == 2 * json.loads(out)["detail"]["serving"]["kv_bytes_per_token"]
    code, out = _run(capsys, [*args, "--precision", "bf16", "--kv-dtype", "fp32"])
    assert code == 2 and "--kv-cache-dtype fp32" in out
