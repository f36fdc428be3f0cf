"""`vllm serve` and SGLang launch lines read with the flags of the releases the readers follow (readers.vllm.FLAGS_OF,
readers.sglang.FLAGS_OF): a flag that release's own parser stops at is said in one line among what the engine's
parser says (Reading.warned; check's lines, --json "warned"), with what replaced it, and is neither modelled nor
given an effect; the spellings the parser takes for a flag trainfit lists are read as that flag.

Expectations from the releases' own sources (`pip download vllm==0.33.0 sglang==0.5.23 --no-deps`, and the older
listed releases' wheels; paths inside the wheel, lines of that release). vLLM's serve parser is
entrypoints/common/cli_args.py:431 make_arg_parser with EngineArgs.add_cli_args (engine/arg_utils.py:959) under
FlexibleArgumentParser (vllm/utils/argparse_utils.py:156); SGLang's is srt/server_args.py:679-680 prepare_server_args
(argparse.ArgumentParser(prog="sglang serve"), allow_abbrev at argparse's default) with ServerArgs.add_cli_args."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfit import serving_versions
from trainfit.readers import read
from trainfit.readers import sglang as sglang_reader
from trainfit.readers import vllm as vllm_reader

MODEL = "llama-3.1-8b"


def _read(tmp_path, line: str, yaml: str | None = None, release: str | None = None):
    """The Reading of a command `line` (with `serve.yaml` beside it), for `release` (ENGINE==VERSION) if given."""
    if yaml is not None:
        (tmp_path / "serve.yaml").write_text(yaml)
    path = tmp_path / "serve.sh"
    path.write_text(line + "\n")
    return read(path, release=serving_versions.parse(release) if release else None)


def _said(r, flag: str) -> list[str]:
    """Every line of the Reading that names `flag` (as the flag itself, not a longer one)."""
    lines = r.not_modelled + r.unknown + r.no_effect + r.warned + r.as_modelled
    return [x for x in lines if x == flag or x.startswith((f"{flag}:", f"{flag} ", f"{flag} ="))]


def test_the_readers_follow_the_releases_the_estimate_models():
    """check's estimate runs the engine's default release (readers set --server vllm / sglang: data/servers.toml
    `default`), so the flag tables must be that release's: a new default needs its parser's flags checked again."""
    assert vllm_reader.FLAGS_OF == serving_versions.parse("vllm").version
    assert sglang_reader.FLAGS_OF == serving_versions.parse("sglang").version


# vLLM 0.33.0's serve parser has none of these (no add_argument of them in engine/arg_utils.py or
# entrypoints/common/cli_args.py, and none is a prefix of one of its flags): `vllm serve m --swap-space 4` exits with
# "unrecognized arguments: --swap-space 4". The older listed releases took them: 0.14.1 engine/arg_utils.py:914
# --swap-space (its V1 engine allocating no swap: v1/engine/core.py:267 num_cpu_blocks = 0); 0.10.1 :503-504
# --max-seq-len-to-capture; 0.19.0 :1221-1222 --max-num-partial-prefills; 0.11.0 :893-894 --cuda-graph-sizes, whose
# place 0.33.0's --cudagraph-capture-sizes / --max-cudagraph-capture-size (:1824-1828) take.
# Before: the first three were listed as not modelled with an effect (host memory, CUDA-graph memory, time), the last
# as unknown.
@pytest.mark.parametrize("flags, flag, replaced", [
    ("--swap-space 4", "--swap-space", "nothing replaced it"),
    ("--max-seq-len-to-capture 8192", "--max-seq-len-to-capture", "--max-cudagraph-capture-size"),
    ("--max-num-partial-prefills 2", "--max-num-partial-prefills", "nothing replaced it"),
    ("--cuda-graph-sizes 512", "--cuda-graph-sizes", "--cudagraph-capture-sizes and --max-cudagraph-capture-size"),
])
def test_a_flag_vllm_no_longer_takes_is_said_in_one_line(tmp_path, flags, flag, replaced):
    r = _read(tmp_path, f"vllm serve m -tp 2 {flags}")
    assert _said(r, flag) == [x for x in r.warned if x.startswith(flag)], _said(r, flag)
    (line,) = _said(r, flag)
    assert line.startswith(f"{flag}: vLLM 0.33.0 has no such flag: `vllm serve` stops at it (unrecognized arguments)")
    assert replaced in line and r.values["tp"] == 2


def test_a_flag_vllm_no_longer_takes_in_its_config_file_is_said_too(tmp_path):
    """A --config YAML's keys are the parser's flags (vllm/utils/argparse_utils.py:606-673 load_config_file):
    `swap-space: 4` is `--swap-space 4`, which 0.33.0's parser stops at."""
    r = _read(tmp_path, "vllm serve m --config serve.yaml", "swap-space: 4\nmax-num-seqs: 64\n")
    assert [x.split(":")[0] for x in r.warned] == ["--swap-space"] and r.values["max_num_seqs"] == 64
    assert not r.not_modelled and not r.unknown


# the spellings vLLM 0.33.0's parser takes for flags trainfit lists: --disable-X pairs with --enable-X
# (EnableDisableAction, vllm/utils/argparse_utils.py:120-145, registered for every bool field :179); -ON, -O N and -O=N
# are --optimization-level N (:395-406; engine/arg_utils.py:1911; -O was --compilation-config's alias up to 0.11.0);
# -cc is --compilation-config (:1891), -ep --enable-expert-parallel (:1306). Before: --disable-prefix-caching,
# --disable-chunked-prefill, -O3, -O=1, -cc, -ep and --max-cudagraph-capture-size were unknown, and -O 0 listed as
# --compilation-config.
@pytest.mark.parametrize("flags, listed", [
    ("--disable-prefix-caching", "--disable-prefix-caching = True: not modelled (time)"),
    ("--disable-chunked-prefill", "--disable-chunked-prefill = True: not modelled (time and the activation peak)"),
    ("-O3", "--optimization-level = '3': not modelled (CUDA-graph memory and time"),
    ("-O 0", "--optimization-level = '0': not modelled (CUDA-graph memory and time"),
    ("-O=1", "--optimization-level = '1': not modelled (CUDA-graph memory and time"),
    ("-cc '{\"mode\": 0}'", "--compilation-config = '{\"mode\": 0}': not modelled (time and CUDA-graph memory)"),
    ("-ep", "--enable-expert-parallel = True: not modelled (memory and time of the MoE experts)"),
    ("--max-cudagraph-capture-size 256", "--max-cudagraph-capture-size = '256': not modelled (CUDA-graph memory"),
])
def test_vllm_spellings_of_listed_flags_are_read_as_those_flags(tmp_path, flags, listed):
    r = _read(tmp_path, f"vllm serve m {flags}")
    assert not r.unknown and not r.warned, (r.unknown, r.warned)
    assert [x for x in r.not_modelled if x.startswith(listed)] == r.not_modelled, r.not_modelled


def test_vllm_short_speculative_config_sets_the_draft(tmp_path):
    """-sc is --speculative-config (vLLM 0.33.0 engine/arg_utils.py:1866). Before: unknown, and no draft estimated."""
    r = _read(tmp_path, "vllm serve m -sc '{\"model\": \"d\", \"num_speculative_tokens\": 4}'")
    assert r.values["draft_model"] == "d" and not r.unknown


def test_vllm_config_file_false_of_a_disable_spelling_adds_no_flag(tmp_path):
    """load_config_file writes a false key as --no-KEY only where the parser has that option
    (vllm/utils/argparse_utils.py:654-658), and EnableDisableAction gives the --disable-X spelling none (:129-142):
    `disable-prefix-caching: false` adds nothing. Before: read as --no-disable-prefix-caching, listed as unknown."""
    r = _read(tmp_path, "vllm serve m --config serve.yaml", "disable-prefix-caching: false\nenforce-eager: false\n")
    assert not r.unknown and not r.not_modelled and not r.warned, (r.unknown, r.not_modelled)


# SGLang 0.5.23's parser stops at these with "ambiguous option" (argparse's allow_abbrev cannot choose): two flags
# begin --cuda-graph-max-bs (arg_groups/fields/exec_.py:629-634: --cuda-graph-max-bs-decode, -prefill), two begin
# --cuda-graph-bs (:640-647), three begin --pp (arg_groups/fields/parallel.py:59-72: --pp-size,
# --pp-max-micro-batch-size, --pp-async-batch-depth). 0.4.4 took --cuda-graph-max-bs and --cuda-graph-bs for its
# (decode) graphs (srt/server_args.py:907-918). Before: --cuda-graph-max-bs was listed as not modelled (CUDA-graph
# memory), --pp 2 read as two pipeline stages, --cuda-graph-bs unknown.
@pytest.mark.parametrize("flags, flag, write", [
    ("--cuda-graph-max-bs 256", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
    ("--cuda-graph-bs 1 2 4", "--cuda-graph-bs", "--cuda-graph-bs-decode"),
    ("--pp 2", "--pp", "--pp-size"),
])
def test_a_flag_sglang_stops_at_is_said_in_one_line(tmp_path, flags, flag, write):
    r = _read(tmp_path, f"python -m sglang.launch_server --model-path m --tp 2 {flags}")
    (line,) = _said(r, flag)
    assert line in r.warned and line.startswith(f"{flag}: SGLang 0.5.23 has no such flag: its parser stops at it")
    assert line.endswith(f"write {write}") and "ambiguous option" in line
    assert r.values["tp"] == 2 and "pp" not in r.values


def test_sglang_graph_flags_of_0_5_23_are_listed(tmp_path):
    """The prefill graphs' largest capture and the per-phase graph backends (arg_groups/fields/exec_.py:613-634)
    change what the CUDA graphs hold. Before: unknown."""
    r = _read(tmp_path, "python -m sglang.launch_server --model-path m --cuda-graph-max-bs-prefill 512 "
                        "--cuda-graph-backend-prefill disabled")
    assert not r.unknown and [x.split(" = ")[0] for x in r.not_modelled] == ["--cuda-graph-max-bs-prefill",
                                                                             "--cuda-graph-backend-prefill"]


def test_sglangs_deprecated_graph_switch_is_read_and_its_warning_said(tmp_path):
    """--disable-cuda-graph is a DeprecatedStoreTrueAction in 0.5.23 (srt/server_args.py:410-415): it still turns both
    graph phases off (arg_groups/cuda_graph_hook.py:55-57) and prints its warning
    (arg_groups/argparse_actions.py:95-100). Before: read, its warning not said."""
    r = _read(tmp_path, "python -m sglang.launch_server --model-path m --disable-cuda-graph")
    assert r.values["enforce_eager"] is True
    assert r.warned == ["SGLang 0.5.23 warns: '--disable-cuda-graph' is deprecated and will be removed in a future "
                        "release. Use '--cuda-graph-backend-{decode,prefill}=disabled' instead."]


def test_check_says_the_flag_in_one_line_and_estimates_the_rest(tmp_path, cli):
    """As trainfit's reader convention for a flag it does not model: the estimate is made (exit 0), and the flag is one
    line of check's, under "warned" in its JSON; the flags vLLM takes are read as before."""
    path = tmp_path / "serve.sh"
    path.write_text(f"vllm serve {MODEL} --max-model-len 8192 --swap-space 16\n")
    code, out, err = cli("check", str(path), "--gpu", "H100-80GB")
    assert code == 0, err
    lines = [x for x in out.splitlines() if "swap-space" in x]
    assert len(lines) == 1 and lines[0].startswith("  · --swap-space: vLLM 0.33.0 has no such flag"), lines
    code, out, _ = cli("check", str(path), "--gpu", "H100-80GB", "--json")
    said = json.loads(out)["check"]
    assert code == 0 and said["settings"]["max_model_len"] == 8192
    assert [x.split(":")[0] for x in said["warned"]] == ["--swap-space"]
    assert not said["unknown"] and not any("swap" in x for x in said["not_modelled"])


def test_a_vllm_flag_written_as_its_prefix_is_named_with_its_whole_flag(tmp_path):
    """`vllm serve`'s parser takes a flag's unique prefix for it (FlexibleArgumentParser leaves allow_abbrev at
    argparse's default: vllm/utils/argparse_utils.py:170-181), so `--gpu-memory-util 0.8` sets
    --gpu-memory-utilization there. trainfit reads whole names only: the line names the whole flag to write, as the
    SGLang reader does, rather than listing a bare unknown (which left the estimate at the default 0.92 unsaid)."""
    r = _read(tmp_path, "vllm serve m --gpu-memory-util 0.8")
    assert [x for x in r.unknown if x.startswith("--gpu-memory-util ") and "--gpu-memory-utilization" in x], r.unknown


# `trainfit check --server ENGINE==VERSION`: the file is for that release. The flags 0.33.0's parser stops at are
# read as the older release takes them (its lines, above), each with its effect there; a release whose own parser does
# not have one (newer than the last that does, or older than the release that added it) stops at it.
@pytest.mark.parametrize("flags, flag, takes, refuses", [
    ("--swap-space 4", "--swap-space", ("0.14.1", "0.8.5"), ("0.19.0",)),
    ("--max-seq-len-to-capture 8192", "--max-seq-len-to-capture", ("0.10.1", "0.8.5"), ("0.11.0", "0.14.1")),
    ("--max-num-partial-prefills 2", "--max-num-partial-prefills", ("0.19.0", "0.10.1"), ()),
    # (added in 0.9.0 with SchedulerConfig.cuda_graph_sizes: 0.8.5 had none)
    ("--cuda-graph-sizes 512", "--cuda-graph-sizes", ("0.11.0", "0.10.1"), ("0.14.1", "0.8.5")),
])
def test_a_flag_of_the_release_the_file_is_for_is_read_as_that_release_takes_it(tmp_path, flags, flag, takes,
                                                                                 refuses):
    for version in takes + refuses:
        r = _read(tmp_path, f"vllm serve m -tp 2 {flags}", release=f"vllm=={version}")
        (line,) = _said(r, flag)
        assert f"vLLM {version} serve flags" in r.source
        if version in takes:
            assert line in r.not_modelled + r.no_effect and not r.warned, (version, line)
        else:
            assert line in r.warned and line.startswith(f"{flag}: vLLM {version} has no such flag: its parser stops "
                                                        "at it (unrecognized arguments)"), (version, line)
        assert r.values["tp"] == 2
    r = _read(tmp_path, f"vllm serve m {flags}", release="sglang==0.4.4")  # another engine's release: vLLM's own
    assert [x for x in r.warned if x.startswith(f"{flag}: vLLM 0.33.0 has no such flag")]


# flags vLLM added after an older listed release: that release's `vllm serve` stops at them (unrecognized arguments),
# so for it nothing they say is read. --kv-cache-memory-bytes: EngineArgs.kv_cache_memory_bytes from 0.11.0
# (engine/arg_utils.py:358), none in 0.10.1's; --optimization-level and --max-cudagraph-capture-size from 0.14.1
# (:578, :381), none in 0.11.0's; -sc (--speculative-config's short alias) from 0.19.0 (:1304). Before, any release read
# them.
@pytest.mark.parametrize("flags, setting, refuses, takes", [
    ("--kv-cache-memory-bytes 8G", "kv_cache_memory", "0.10.1", "0.11.0"),
    ("--max-cudagraph-capture-size 64", None, "0.11.0", "0.14.1"),
    ("-sc '{\"model\": \"llama-3.2-1b\"}'", "draft_model", "0.14.1", "0.19.0"),
])
def test_a_flag_added_since_the_release_the_file_is_for_is_said_and_not_read(tmp_path, flags, setting, refuses,
                                                                             takes):
    line = f"vllm serve {MODEL} {flags}"
    flag = flags.split()[0]
    r = _read(tmp_path, line, release=f"vllm=={refuses}")
    (said,) = [x for x in r.warned if x.startswith(f"{flag}: vLLM {refuses} has no such flag")]
    assert f"{takes}, " in said and said.endswith("take it")  # (the listed releases whose parser has it)
    assert setting not in r.values and not _said(r, flag)[1:]
    r = _read(tmp_path, line, release=f"vllm=={takes}")
    assert not r.warned and (setting in r.values or _said(r, flag))


def test_an_older_release_reads_its_flags_and_abbreviations_as_its_parser_does(tmp_path):
    """SGLang 0.4.4 (its ServerArgs parser, allow_abbrev on: srt/server_args.py:1069): --model is the one option it
    begins, --model-path (:307), --tp is --tp-size (:522); it has no --pp-size (no pipeline parallelism), no --config
    and no `sglang serve` (its wheel declares no console script). vLLM 0.10.1 takes -O3 as -O with its value (its
    --compilation-config short option, engine/arg_utils.py; vllm/utils/__init__.py:1805)."""
    r = _read(tmp_path, f"python -m sglang.launch_server --model {MODEL} --tp 2 --pp-size 2 --cuda-graph-bs 1 2 4",
              release="sglang==0.4.4")
    assert r.model == MODEL and r.values["tp"] == 2 and "pp" not in r.values
    assert [x.split(":")[0] for x in r.warned] == ["--pp-size"] and "0.5.23 takes it" in r.warned[0]
    assert [x for x in r.not_modelled if x.startswith("--cuda-graph-bs")]  # (0.4.4's decode graph sizes: GONE)
    r = _read(tmp_path, f"python -m sglang.launch_server --model-path {MODEL} --cuda-graph-bs 1 2",
              release="sglang==0.4.1")  # (0.4.1 has no --cuda-graph-bs: 0.4.3.post4 added it)
    assert [x.split(":")[0] for x in r.warned] == ["--cuda-graph-bs"]
    r = _read(tmp_path, "python -m sglang.launch_server --config serve.yaml", yaml=f"model-path: {MODEL}\ntp-size: 2\n",
              release="sglang==0.4.4")
    assert [x.split(":")[0] for x in r.warned] == ["--config"] and "tp" not in r.values
    r = _read(tmp_path, f"sglang serve {MODEL} --tp-size 2", release="sglang==0.4.4")
    assert r.warned[0].startswith("sglang serve: SGLang 0.4.4 has no such command") and r.values["tp"] == 2
    r = _read(tmp_path, f"vllm serve {MODEL} -O3", release="vllm==0.10.1")
    assert not r.warned and [x for x in r.not_modelled if x.startswith("--optimization-level")]


def test_sglang_flags_of_its_older_releases_are_read_for_them(tmp_path):
    """SGLang 0.4.4 takes --cuda-graph-max-bs for the decode graphs (srt/server_args.py:907-912), which 0.5.23's parser
    stops at (an ambiguous prefix): for 0.4.4 it is the decode graphs' largest batch, the knob the estimate sizes as
    SGLang does (as 0.5.23's --cuda-graph-max-bs-decode); --pp is no listed release's flag."""
    r = _read(tmp_path, f"python -m sglang.launch_server --model-path {MODEL} --cuda-graph-max-bs 64 --pp 2",
              release="sglang==0.4.4")
    assert [x.split(":")[0] for x in r.warned] == ["--pp"] and r.warned[0].endswith("no listed release takes it")
    assert [(knob, key, v) for knob, key, v, _ in r.sized] == [("cuda_graph_max_bs", "--cuda-graph-max-bs", 64)]
    r.against({"cuda_graph_max_bs": 64})
    assert r.as_modelled == ["--cuda-graph-max-bs 64"] and not r.not_modelled


def test_the_readers_flags_are_their_releases_own():
    """Every flag the readers name for the release they follow is an option of that release's own parser
    (data/serve_flags.json, dumped from it: bench/tools/serve_parsers.py), save the spellings its parser takes
    otherwise: vLLM's --no-enable-prefix-caching (EnableDisableAction takes --no-X without listing it,
    vllm/utils/argparse_utils.py:120-145) and SGLang's --tp, --dp (prefixes of --tp-size, --dp-size); and no flag the
    readers say their release stops at (GONE) is one of its options, while a listed release takes each but --pp."""
    for reader, extra in ((vllm_reader, {*vllm_reader.SHORT, *(f"--{k}" for k in (*vllm_reader.STORE_TRUE,
                                                                                   *vllm_reader.INVERSE))}),
                          (sglang_reader, {f"--{k}" for k in (*sglang_reader.ALIASES, *sglang_reader.SIZED)})):
        release = serving_versions.parse(reader.ENGINE)
        names = {o for a in reader.parser()._actions for o in a.option_strings} | extra | {
            f"--{k}" for k in (*reader.NO_EFFECT, *reader.EFFECT)}
        assert {n for n in names if serving_versions.parser_takes(release, n) != (n,)} == (
            {"--no-enable-prefix-caching"} if reader is vllm_reader else {"--tp", "--dp"})
        assert not [k for k in reader.GONE if serving_versions.parser_takes(release, f"--{k}") == (f"--{k}",)]
        assert [k for k in reader.GONE if not serving_versions.releases_taking(reader.ENGINE, f"--{k}")] == (
            [] if reader is vllm_reader else ["pp"])


def test_every_listed_release_has_its_parsers_flags():
    """data/serve_flags.json holds each release data/servers.toml lists, and no other."""
    table = json.loads((Path(serving_versions.__file__).parent / "data" / "serve_flags.json").read_text())
    for engine in serving_versions.ENGINES:
        assert set(table[engine]) == set(serving_versions.versions(engine))


def test_check_server_models_the_release_the_command_is_for(tmp_path, capsys):
    """`trainfit check serve.sh --server vllm==0.10.1`: the estimate's start-up is 0.10.1's (its profile run and
    memory utilisation, data/servers.toml), the 0.10.1 flag read with its effect; another engine is one line, exit 2."""
    from trainfit.cli.app import main

    path = tmp_path / "serve.sh"
    path.write_text(f"vllm serve {MODEL} --max-seq-len-to-capture 8192 --max-model-len 8192\n")
    main(["check", str(path), "--gpu", "H100-80GB", "--server", "vllm==0.10.1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["detail"]["serving"]["version"] == "0.10.1" and out["check"]["settings"]["server"] == "vllm==0.10.1"
    assert not out["check"]["warned"] and out["check"]["not_modelled"][0].startswith("--max-seq-len-to-capture")
    main(["check", str(path), "--gpu", "H100-80GB", "--json"])
    now = json.loads(capsys.readouterr().out)
    assert now["detail"]["serving"]["version"] == "0.33.0" and now["check"]["warned"]
    assert now["detail"]["serving"]["activation_peak"] != out["detail"]["serving"]["activation_peak"]
    with pytest.raises(SystemExit) as e:
        main(["check", str(path), "--gpu", "H100-80GB", "--server", "sglang"])
    assert e.value.code == 2
    assert "the files are a vllm command" in capsys.readouterr().err
    main(["check", str(path), "--gpu", "H100-80GB", "--server", "vllm==0.10", "--json"])  # major.minor: its release
    assert json.loads(capsys.readouterr().out)["check"]["settings"]["server"] == "vllm==0.10.1"
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_shard_degree = 8\n')
    with pytest.raises(SystemExit) as e:
        main(["check", str(job), "--server", "vllm"])
    assert e.value.code == 2 and "hold no serving command" in capsys.readouterr().err


def test_check_for_an_older_release_says_the_flag_it_stops_at_and_estimates_without_it(tmp_path, capsys):
    """`trainfit check serve.sh --server vllm==0.10.1` on a command with --kv-cache-memory-bytes (from 0.11.0,
    EngineArgs engine/arg_utils.py:358; none in 0.10.1's): the flag is one warned line and the estimate's KV pool is
    0.10.1's own sizing, that of the same command without the flag; for 0.11.0 the pool is the flag's 8 GiB."""
    from trainfit.cli.app import main

    def pool(line: str, server: str) -> tuple[float, list]:
        path = tmp_path / "serve.sh"
        path.write_text(line + "\n")
        main(["check", str(path), "--gpu", "H100-80GB", "--server", server, "--json"])
        out = json.loads(capsys.readouterr().out)
        return out["detail"]["serving"]["available_kv"], out["check"]["warned"]

    flagged, bare = f"vllm serve {MODEL} --kv-cache-memory-bytes 8G", f"vllm serve {MODEL}"
    kv, warned = pool(flagged, "vllm==0.10.1")
    assert [w for w in warned if w.startswith("--kv-cache-memory-bytes: vLLM 0.10.1 has no such flag")]
    assert kv == pool(bare, "vllm==0.10.1")[0]
    kv, warned = pool(flagged, "vllm==0.11.0")
    assert not warned and kv == 8 * 2**30
