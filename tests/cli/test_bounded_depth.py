"""Bounded work at any depth: a config.json whose layer count (num_hidden_layers, num_layers, n_layer, encoder_layers,
decoder_layers, num_decoder_layers, a vision tower's depth, in text_config / vision_config too) is 10**9 or 2**40,
for every model_type trainfit reads, answers in seconds within a few GiB or is refused in one line: the layers are
counted in runs (phases.Pattern, hf_config's counts), never walked one by one. Each model_type runs in a process of
its own under an address-space limit (RLIMIT_AS), so a per-layer list fails as a MemoryError, not by filling the
machine, and a per-layer loop as a timeout."""
import json
import random
import resource
import subprocess
import sys
from importlib import resources

import pytest

from trainfit.models import hf_config
from trainfit.models.hf_config import SUPPORTED_MODEL_TYPES, spec_from_config

DEPTHS = (10**9, 2**40)
# every key a supported builder reads as a layer count (models/hf_config.py, models/vlm.py, models/mllama.py)
DEPTH_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers", "num_decoder_layers",
              "depth", "num_global_layers")
NESTED = ("text_config", "vision_config")
# the runs of each config: a training step with fit advice, inference, serving
RUNS = (("--gpu", "H100-80GB"), ("--mode", "infer"), ("--mode", "serve", "--gpu", "H100-80GB"))
WALL = 30  # seconds per run: a hang guard (each takes about a second on an idle 2-core machine)
MEMORY = 4 * 2**30  # the process's address space: a per-layer list of 10**9 entries is 8 GiB of pointers alone


def _configs() -> dict:
    """The smallest catalog config.json of each model_type."""
    best: dict = {}
    for f in resources.files("trainfit.models.catalog").iterdir():
        if f.name.endswith(".json"):
            text = f.read_text()
            mt = json.loads(text)["model_type"]
            if mt not in best or len(text) < len(best[mt]):
                best[mt] = text
    return {mt: json.loads(text) for mt, text in best.items()}


CONFIGS = _configs()


def _set(config: dict, path: tuple, value) -> dict:
    out = json.loads(json.dumps(config))
    inner = out
    for k in path[:-1]:
        inner = inner.setdefault(k, {})
    inner[path[-1]] = value
    return out


def depth_keys(config: dict) -> list[tuple]:
    """The layer-count keys the builder reads: those whose value changes the spec it builds (an alias that another
    key overrides, or a key of another family, does not)."""
    base = spec_from_config(config, "m")
    places = [()] + [(n,) for n in NESTED if isinstance(config.get(n), dict)]
    found = []
    for place in places:
        for key in DEPTH_KEYS:
            path = place + (key,)
            try:
                if spec_from_config(_set(config, path, 7), "m") != base:
                    found.append(path)
            except Exception:  # noqa: BLE001 (7 layers may not fit the config's own layer lists: read, then)
                found.append(path)
    return found


# Nemotron-H's layer count is its block pattern's length (models/hf_config.py _nemotron_h_blocks; NemotronHConfig
# ignores num_hidden_layers): a config's own list, as long as its text (tests/web/test_bounded_requests.py sends one of
# 100,000 blocks)
PATTERN_DEPTH = {"nemotron_h"}


def test_every_model_type_has_a_catalog_config_and_a_depth_key():
    assert sorted(CONFIGS) == sorted(SUPPORTED_MODEL_TYPES)
    for mt, config in CONFIGS.items():
        assert bool(depth_keys(config)) != (mt in PATTERN_DEPTH), mt


# run in the child: each case as `trainfit estimate`, its exit code, last stderr line and seconds, one JSON line each
_DRIVER = r"""
import contextlib, io, json, signal, sys, time
from trainfit.cli import main
for path, args in json.loads(sys.stdin.read()):
    def hang(*_):
        raise TimeoutError
    signal.signal(signal.SIGALRM, hang)
    signal.alarm(WALL)
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["estimate", path, *args])
        code = 0
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:
        code, err = repr(e), io.StringIO(type(e).__name__)
    signal.alarm(0)
    print(json.dumps([path, args, code, err.getvalue(), time.perf_counter() - t0]), flush=True)
""".replace("WALL", str(WALL))


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_huge_depth_answers_or_is_refused_in_one_line(model_type, tmp_path):
    config = CONFIGS[model_type]
    cases = []
    for path in depth_keys(config) or [("num_hidden_layers",)]:  # (Nemotron-H: ignored, so answered)
        for depth in DEPTHS:
            p = tmp_path / f"{'.'.join(path)}-{depth}.json"
            p.write_text(json.dumps(_set(config, path, depth)))
            cases += [(str(p), list(run)) for run in RUNS]
    r = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(cases), capture_output=True, text=True,
                       timeout=WALL * len(cases) + 30, preexec_fn=_limit)
    done = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(done) == len(cases), (r.stderr[-2000:], done[-1:])
    for path, args, code, err, took in done:
        case = f"{path.rsplit('/', 1)[-1]} {' '.join(args)}"
        assert code in (0, 2), (case, code, err[-500:])
        assert "Traceback" not in err and took < WALL, (case, err[-500:], took)
        if code == 2:
            assert err.startswith("error:") and err.count("\n") == 1, (case, err)


def test_layer_points_are_the_walk():
    """phases.peak over a Pattern of runs is the peak over the same layers written out one by one (every per-layer
    moment taken, as before the runs): the same phases, peak and moment at the peak, for random kinds and runs."""
    from trainfit.analytic.phases import LayerKind, Pattern, StepBytes, peak

    rng = random.Random(7)
    for _ in range(1500):
        kinds = tuple(LayerKind(rng.randint(0, 50) * 8.0, rng.randint(0, 90) * 8.0, rng.randint(0, 10) * 8.0,
                                rng.randint(0, 20) * 8.0, rng.choice((None, rng.randint(0, 40) * 8.0)),
                                rng.choice((0.0, rng.randint(0, 120) * 8.0))) for _ in range(rng.randint(1, 3)))
        runs = tuple((tuple((rng.randrange(len(kinds)), rng.randint(0, 7)) for _ in range(rng.randint(1, 3))),
                      rng.randint(0, 7)) for _ in range(rng.randint(1, 3)))
        pattern = Pattern(runs)
        if not len(pattern):
            continue
        written = tuple(k for block, times in runs for _ in range(times) for k, n in block for _ in range(n))
        gathered_at = rng.choice(({}, {"layer_backward": (rng.randint(0, 9) * 8.0, rng.randint(0, 9) * 8.0),
                                       "first_layer_backward": 800.0, "last_layer_backward": 80.0}))
        common = dict(resident={"weights": 1000.0}, gradients=sum(
            (k.gradients if k.gradients is not None else 16.0) for k in (kinds[j] for j in written)) + 40.0,
            accumulating=rng.random() < 0.3, head_gradients=40.0, layer_gradients=16.0, layers=len(written),
            in_flight=rng.choice((1, 2)), layer_saved=0.0, embedding_saved=24.0, head_saved=56.0, inputs=8.0,
            forward_transient=64.0, loss_backward=72.0, layer_backward=0.0, layer_freed=0.0, layer_grads_done=0.0,
            embedding_backward=32.0, gathered=8.0, optimizer_transient=48.0, masks_first=rng.choice((0.0, 88.0)),
            gathered_at=gathered_at, kinds=kinds, layers_on_device=rng.choice((None, 1, 3)))
        a, b = peak(StepBytes(pattern=pattern, **common)), peak(StepBytes(pattern=written, **common))
        assert (a.phases, a.phase, a.peak, a.at_peak) == (b.phases, b.phase, b.peak, b.at_peak), runs
        assert StepBytes(pattern=pattern, **common).layers_saved == StepBytes(pattern=written, **common).layers_saved


def test_counted_layers_are_the_walked_ones():
    """hf_config's counts in closed form (Qwen-MoE's sparse layers, Qwen3-Next's linear ones, Llama 4's RoPE and MoE
    layers) are the per-layer walks transformers' config classes describe."""
    rng = random.Random(9)
    for _ in range(3000):
        layers, step, experts = rng.randint(1, 60), rng.randint(1, 8), rng.choice((0, 1, 8))
        only = [rng.choice((rng.randint(-3, 70), float(rng.randint(0, 50)), 2.5, True, "x"))
                for _ in range(rng.randint(0, 6))]
        c = hf_config._Cfg({"decoder_sparse_step": step, "mlp_only_layers": only}, "t", "qwen3_moe")
        # modeling_qwen2_moe.py Qwen2MoeDecoderLayer: sparse iff not in mlp_only_layers and (i + 1) % step == 0
        walked = sum(1 for i in range(layers) if i not in only and experts > 0 and (i + 1) % step == 0)
        assert hf_config._moe_layers(c, layers, experts) == walked
        interval = rng.randint(1, 9)
        c = hf_config._Cfg({"full_attention_interval": interval}, "t", "qwen3_next")
        linear = [i for i in range(layers) if (i + 1) % interval]  # Qwen3NextConfig: linear unless (i + 1) % n == 0
        assert hf_config._linear_attention_layers(c, layers) == ((len(linear), linear[-1]) if linear else (0, -1))
        nope = rng.randint(1, 70)
        c = hf_config._Cfg({"no_rope_layer_interval": nope, "interleave_moe_layer_step": step}, "t", "llama4_text")
        rope = [int((i + 1) % nope != 0) for i in range(layers)]  # Llama4TextConfig.__post_init__
        every = next((s for s in range(2, layers + 1) if rope == [int((i + 1) % s != 0) for i in range(layers)]), 0)
        assert hf_config._llama4_rope_layers(c, layers) == (sum(rope), next(
            (i for i, r in enumerate(rope) if not r), layers), every)
        assert hf_config._llama4_moe_layers(c, layers) == len(list(range(step - 1, layers, step)))
