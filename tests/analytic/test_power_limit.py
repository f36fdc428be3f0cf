"""--power-limit (RunSettings.power_limit): a board power cap replaces the GPU's TDP for the run, lowers the compute
rates by roofline.power_clock and sets the energy; and the Blackwell attention SDPA runs (kernels.toml
[generation.blackwell] attention.cudnn) against the published cuDNN measurement it comes from."""
import pytest

from trainfit import api
from trainfit.analytic.roofline import attention_seconds, gemm_seconds, kernels_for, power_clock, runnable
from trainfit.cli import main
from trainfit.data import load_toml
from trainfit.errors import SetupError
from trainfit.hardware import get_gpu

B200_STATIC = 137.0  # data/power.toml [static.B200]: nvidia-smi at P0, 0 % (ROCM5219)


def test_power_clock_falls_with_the_cap():
    clocks = [power_clock(w, 1000, B200_STATIC) for w in (300, 500, 700, 900, 1000, 1200)]
    assert clocks == sorted(clocks) and clocks[-2:] == [1.0, 1.0]
    assert 0 < clocks[0] < clocks[1]


def _b200_step(power_limit=None):
    return api.estimate("llama-3.1-8b", gpu="B200", power_limit=power_limit, stack="torchtitan", dp=8, zero=3,
                        seq=8192, batch=1, compile=True, recompute="op").detail.step_time.as_dict()


def test_b200_at_700_w_runs_its_matmuls_at_the_capped_clock():
    # hand derivation: board power = P_static + (1000 - P_static) f V^2, V following f down to the voltage floor
    # (kernels.toml [voltage_floor] clock = k, Blackwell listed) and V = k below it. r = (700 - 137) / (1000 - 137)
    # = 0.6524 < k^3, so the clock that draws 700 W is on the floor: f k^2 = r; every tensor-core rate scales with it,
    # the memory's not
    k = load_toml("kernels.toml")["voltage_floor"]["clock"]
    r = (700 - B200_STATIC) / (1000 - B200_STATIC)
    assert r < k ** 3
    f = r / k ** 2
    assert B200_STATIC + (1000 - B200_STATIC) * f * k ** 2 == pytest.approx(700)
    assert f == pytest.approx(0.709, abs=2e-3)
    capped, full = _b200_step(700), _b200_step()
    assert capped["compute_terms"]["gemm"] == pytest.approx(full["compute_terms"]["gemm"] / f, rel=0.01)
    assert capped["compute_terms"]["memory"] == pytest.approx(full["compute_terms"]["memory"], rel=1e-9)
    # one large GEMM, launch aside: exactly 1 / f longer
    b200, b700 = get_gpu("B200"), get_gpu("B200").with_power_limit(700)
    launch = kernels_for(b200).launch_seconds
    ratio = (gemm_seconds(b700, 16384, 16384, 16384, "bf16") - launch) / \
        (gemm_seconds(b200, 16384, 16384, 16384, "bf16") - launch)
    assert ratio == pytest.approx(1 / f, rel=1e-9)


def test_the_cap_sets_the_energy_and_a_cap_above_the_tdp_is_refused():
    capped = get_gpu("B200").with_power_limit(700)
    assert capped.power_watts == 700 and get_gpu("B200").power_watts == 1000
    assert get_gpu("B200").with_power_limit(None) is get_gpu("B200")
    with pytest.raises(SetupError, match="at most 1000 W"):
        api.estimate("llama-3.2-1b", gpu="B200", power_limit=1001)


def test_a_cap_at_or_below_the_static_power_is_refused():
    """At the board's idle draw nothing is left to clock the SMs (power_clock: r = 0, a zero rate): refused, not a
    division by zero; just above it the run is slow but finite."""
    with pytest.raises(SetupError, match="137 W idle"):
        api.estimate("llama-3.2-1b", gpu="B200", power_limit=B200_STATIC)
    assert api.estimate("llama-3.2-1b", gpu="B200", power_limit=B200_STATIC + 13).time.step_seconds > 0
    assert 0 < power_clock(B200_STATIC + 13, 1000, B200_STATIC) < 0.5


def test_a_cap_at_or_below_the_static_power_is_refused_under_mfu_too(capsys):
    """The cap is the board's, timed or not: under --mfu (no kernel timed) a 100 W cap on a B200 was accepted and its
    energy reported at 100 W per GPU, below the board's idle draw; now the same one line as the timed step's."""
    with pytest.raises(SetupError, match="137 W idle"):
        api.estimate("llama-3.2-1b", gpu="B200", power_limit=100, mfu=0.4, tokens=1e9)
    with pytest.raises(SystemExit) as e:
        main(["estimate", "llama-3.2-1b", "--gpu", "B200", "--power-limit", "100", "--mfu", "0.4", "--tokens", "1B"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "137 W idle" in err
    # a cap above the TDP names the range a cap can take, not 1 W upwards (1 W is refused as below the idle draw)
    with pytest.raises(SetupError, match="give a cap above 137 W and at most 1000 W"):
        api.estimate("llama-3.2-1b", gpu="B200", power_limit=2000, mfu=0.4)


def test_cli_refuses_a_cap_above_the_tdp_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--power-limit", "5000"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "700 W" in err


def test_b200_sdpa_is_cudnn_at_its_published_rate():
    # NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training (B200, torch 2.9 SDPA's cuDNN backend, bf16, causal,
    # 1 x 128 heads x d 128): 16k tokens fwd 6.602 ms, bwd 20.460 ms; 8k tokens fwd 1.877, bwd 5.833 ms
    b200 = get_gpu("B200")
    assert runnable(kernels_for(b200), "sdpa") == "cudnn"
    fwd = attention_seconds(b200, "sdpa", 128, 16384, 16384, 128, True, "bf16", False)
    bwd = attention_seconds(b200, "sdpa", 128, 16384, 16384, 128, True, "bf16", True)
    assert fwd == pytest.approx(6.602e-3, rel=0.04) and bwd == pytest.approx(20.460e-3, rel=0.04)
    # the estimate's attention: llama-3.1-8b's 32 layers of 32 query heads at 8k, forward and backward (op SAC saves
    # the attention output: no recompute), i.e. a quarter of the benchmark's 128 heads per call. NB: the model's
    # sequence factor reads 8k ~7 % faster than cuDNN ran it (16k's fraction over the FA2 tile model)
    published = 32 * (1.877e-3 + 5.833e-3) / 4
    assert _b200_step()["compute_terms"]["attention"] == pytest.approx(published, rel=0.10)


def test_tf32_needs_tf32_tensor_cores():
    """--tf32 on a GPU without TF32 (V100, T4: no TF32 peak in the catalog) is refused, not timed on another path
    (before: accepted, and slower than without it)."""
    with pytest.raises(SetupError, match="--tf32 .* V100-32GB has not"):
        api.estimate("llama-3.2-1b", precision="fp32", tf32=True, gpu="V100-32GB")
    assert api.estimate("llama-3.2-1b", precision="fp32", tf32=True, gpu="A100-80GB").time.step_seconds > 0
