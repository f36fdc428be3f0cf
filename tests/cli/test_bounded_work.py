"""Bounded work (issue 35): every integer size of `estimate`, `plan` and `sweep` answers or is refused quickly,
however large; the limits are trainfit/limits.py's, each refusal names it. A hang fails (SIGALRM), not blocks."""
import signal
import time

import pytest

from trainfit import limits
from trainfit.setup import SETTINGS

HUGE = (10**6, 10**9, 10**12, 10**18, 2**63, 10**30)
WALL = 60  # seconds per case: a hang guard, not a speed target (each answers in about 2 s on an idle 2-core machine; a loaded one is slower)
INTS = [s for s in SETTINGS if s.base_type is int and s.meta.choices is None]


@pytest.fixture
def bounded(cli):
    """cli(*args) under a SIGALRM guard: (exit code, stdout, stderr, seconds)."""
    def run(*args):
        def hang(*_):
            raise TimeoutError(f"trainfit {' '.join(args)} ran past {WALL} s")

        old = signal.signal(signal.SIGALRM, hang)
        signal.alarm(WALL)
        t0 = time.perf_counter()
        try:
            code, out, err = cli(*args)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        return code, out, err, time.perf_counter() - t0

    return run


def test_every_integer_setting_has_an_upper_bound():
    """Each integer setting is a size: a maximum from trainfit/limits.py (with its reason), or a list of choices."""
    for s in SETTINGS:
        if s.base_type is int:
            assert s.meta.choices is not None or isinstance(s.meta.maximum, (limits.Bound, int)), s.flag


def _answered_or_refused(code, err, value, flag, maximum=limits.TOKENS):
    assert code in (0, 2), err
    if code == 2:  # one line, no traceback
        assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err, err
    if value > maximum:  # beyond the bound: refused, naming the flag and the limit (and why, for limits.py's)
        assert code == 2 and flag in err and f"{maximum:,}" in err, err
        assert not isinstance(maximum, limits.Bound) or maximum.why in err, err


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("setting", INTS, ids=lambda s: s.name)
def test_estimate_sizes_are_bounded(bounded, setting, value):
    mode = setting.meta.modes[0]
    gpu = ("--gpu", "H100-80GB") if mode in ("train", "serve", "rl") else ()
    code, out, err, took = bounded("estimate", "tiny-llama", "--mode", mode, setting.flag, str(value), *gpu)
    _answered_or_refused(code, err, value, setting.flag, setting.meta.maximum)
    assert took < WALL


# (--gpus 2**31 - 1 and beyond are refused at once; below, the planner's layouts of 10**6 or 10**9 GPUs take ~2 s)
@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("flag", ["--gpus", "--seq", "--top"])
def test_plan_sizes_are_bounded(bounded, flag, value):
    code, out, err, took = bounded("plan", "tiny-llama", "--gpu", "H100-80GB", flag, str(value))
    _answered_or_refused(code, err, value, flag, limits.RANKS if flag == "--gpus" else
                         limits.TOKENS if flag == "--seq" else float("inf"))
    assert took < WALL


@pytest.mark.parametrize("value", (10**9, 2**63, 10**30))
@pytest.mark.parametrize("knob", ["batch", "seq", "gpus", "tp"])
def test_sweep_sizes_are_bounded(bounded, knob, value):
    code, out, err, took = bounded("sweep", "tiny-llama", "--gpu", "H100-80GB", "--vary", knob, f"1:{value}")
    assert code in (0, 2) and "Traceback" not in err, err
    assert took < WALL


def test_a_billion_layers_costs_one_layer(bounded, tmp_path):
    """The layers are alike: a config of 10**9 layers answers (fit advice included) as fast as one of 16, and the
    memory grows with the layers (an independent check: weights = layers x one layer's parameters x 2 bytes)."""
    import json

    base = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 2000, "max_position_embeddings": 512}
    weights = {}
    for layers in (16, 10**9):
        p = tmp_path / f"l{layers}.json"
        p.write_text(json.dumps(dict(base, num_hidden_layers=layers)))
        code, out, err, took = bounded("estimate", str(p), "--gpu", "H100-80GB", "--json")
        assert code == 0, err
        weights[layers] = json.loads(out)["memory"]["weights"]
    # one llama layer: q, o (h x h), k, v (h x h/4 each), gate, up, down (h x 688), two norms (h)
    h = 256
    layer = 2 * h * h + 2 * h * (h // 4) + 3 * h * 688 + 2 * h
    # amp-bf16 keeps fp32 weights (autocast casts per op): 4 bytes a parameter
    assert (weights[10**9] - weights[16]) == pytest.approx((10**9 - 16) * layer * 4, rel=1e-6)


def test_flash_block_steps_closed_form_is_the_loop():
    """roofline._block_steps sums its tiles' key-block steps in closed form: the same as walking the tiles."""
    import math
    import random

    from trainfit.analytic.roofline import _block_steps

    def walked(s_q, s_kv, br, bc):
        full, total, longest = math.ceil(s_kv / bc), 0, 0
        for t in range(math.ceil(s_q / br)):
            steps = min(full, max(0, math.ceil(((t + 1) * br + s_kv - s_q) / bc)))
            total, longest = total + steps, max(longest, steps)
        return math.ceil(s_q / br), total, longest

    rng = random.Random(35)
    for _ in range(3000):
        s_q, s_kv = rng.randint(0, 5000), rng.randint(0, 5000)
        br, bc = rng.choice((1, 64, 128, 176)), rng.choice((1, 32, 64, 128))
        assert _block_steps.__wrapped__(s_q, s_kv, br, bc, True) == walked(s_q, s_kv, br, bc)


def test_new_segments_closed_form_is_the_loop():
    """foreach_segments.new_segments places each size's copies in closed form once no cached block holds one: the
    same bytes as placing them one by one (as it once did, O(layers): a 10**9-layer config hung)."""
    import random

    from trainfit.alloc.caching_allocator import K_SMALL_SIZE, allocation_size, round_size
    from trainfit.analytic.foreach_segments import _CONF, new_segments

    def one_by_one(temporaries, blocks, largest_activation, activation_cache):
        free, opened = sorted(b for b in blocks if b > 0), 0
        for nbytes, count in sorted(temporaries, reverse=True):
            n = round_size(int(nbytes), _CONF)
            if n <= K_SMALL_SIZE:
                continue
            for _ in range(count):
                fit = next((k for k, b in enumerate(free) if b >= n), None)
                if fit is not None:
                    rest = free.pop(fit) - n
                    if rest > 0:
                        free.append(rest)
                        free.sort()
                elif n <= largest_activation and activation_cache >= n:
                    activation_cache -= n
                else:
                    opened += allocation_size(n)
        return opened

    rng = random.Random(36)
    mib = 2**20
    for _ in range(2000):
        temps = [(rng.randint(1, 300) * mib // rng.choice((1, 3)), rng.randint(0, 40)) for _ in range(rng.randint(0, 5))]
        blocks = [rng.randint(0, 900) * mib for _ in range(rng.randint(0, 4))]
        args = (temps, blocks, rng.choice((0, 64 * mib, 512 * mib)), rng.randint(0, 4000) * mib)
        assert new_segments(*args) == one_by_one(*args), args


def test_a_billion_wide_layers_answers(bounded, tmp_path):
    """A config whose layers' tensors are large enough to open gradient and foreach segments (2048 wide: 64 MiB MLP
    gradients), 10**9 of them, answers (it took ~0.4 ms a layer)."""
    import json

    p = tmp_path / "wide.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                             "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 10**9,
                             "vocab_size": 32000, "max_position_embeddings": 4096}))
    code, out, err, took = bounded("estimate", str(p), "--gpu", "H100-80GB", "--json")
    assert code == 0 and took < WALL, err


def test_a_step_beyond_int64_bytes_is_refused(bounded, tmp_path):
    """10**12 layers hold ~3.7e19 bytes on one GPU: more than PyTorch's allocator counts (int64), refused in one line
    (it answered, with parts that no longer summed to the peak in float arithmetic)."""
    import json

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
                             "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 10**12,
                             "vocab_size": 2000, "max_position_embeddings": 512}))
    code, out, err, took = bounded("estimate", str(p))
    assert code == 2 and "more than 2**63 - 1" in err and err.count("\n") == 1, err
