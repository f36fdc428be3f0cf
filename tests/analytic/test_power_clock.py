"""Power-capped SM clock (roofline.power_clock): C2's H100 runs at 500 W (calibration.md) while its MAMF fraction was
measured on the 700 W H100 SXM. The law: board power = P_static + dynamic, dynamic = C V^2 f with V ∝ f above the
voltage-floor clock and V = V_min below it (kernels.toml [voltage_floor], fitted on C2/C5)."""
import pytest

from trainfit.analytic.roofline import kernels_for, power_clock, voltage_floor
from trainfit.data import load_toml
from trainfit.hardware import get_gpu

KNEE = load_toml("kernels.toml")["voltage_floor"]["clock"]


def _board_watts(f: float, ref: float, static: float, knee: float) -> float:
    """Hand model of the board's draw at clock f (f_ref = 1): dynamic = (ref - static) x f x (V / V_ref)^2, the
    voltage following the clock down to the floor (V / V_ref = f) and staying there below it (= knee)."""
    return static + (ref - static) * f * max(f, knee) ** 2


@pytest.mark.parametrize("cap", [500, 650])
def test_cap_clock_draws_exactly_the_cap(cap):
    # the clock the law gives, put back into the hand model of the board, draws the cap: at 500 W below the floor
    # (linear branch), at 650 W above it (cube branch)
    f = power_clock(cap, 700, 142, KNEE)
    assert _board_watts(f, 700, 142, KNEE) == pytest.approx(cap, rel=1e-9)
    assert (f < KNEE) == (cap == 500)


def test_hand_values_at_500_w():
    # 500 W: r = (500 - 142) / (700 - 142) = 0.6416; below the floor f = r / k^2; the cube law alone: r^(1/3) = 0.862
    r = 358 / 558
    assert power_clock(500, 700, 142) == pytest.approx(r ** (1 / 3)) == pytest.approx(0.862, abs=1e-3)
    assert power_clock(500, 700, 142, KNEE) == pytest.approx(r / KNEE ** 2)
    assert power_clock(500, 700, 142, KNEE) == pytest.approx(0.698, abs=2e-3)


def test_clock_is_monotone_and_continuous_at_the_floor():
    caps = [142 + i * 0.5 for i in range(0, 1200)]
    clocks = [power_clock(w, 700, 142, KNEE) for w in caps]
    assert all(b >= a for a, b in zip(clocks, clocks[1:])) and clocks[0] == 0.0 and clocks[-1] == 1.0
    at_floor = 142 + 558 * KNEE ** 3  # where the two branches meet
    assert power_clock(at_floor - 1e-6, 700, 142, KNEE) == pytest.approx(power_clock(at_floor + 1e-6, 700, 142, KNEE),
                                                                        abs=1e-6)
    # the floor only ever lowers the clock: below it the linear branch runs under the cube root
    assert all(power_clock(w, 700, 142, KNEE) <= power_clock(w, 700, 142) + 1e-12 for w in caps)


def test_uncapped_boards_keep_their_fractions():
    assert power_clock(700, 700, 142, KNEE) == 1.0 and power_clock(500, 0, 142, KNEE) == 1.0
    assert power_clock(800, 700, 142, KNEE) == 1.0
    assert kernels_for(get_gpu("H100-80GB")).matmul("bf16") == pytest.approx(0.803)  # MAMF 794.5 / 989
    assert kernels_for(get_gpu("H200")).matmul("bf16") == pytest.approx(0.803)


def test_grand_teton_h100_runs_slower_than_sxm():
    capped, sxm = kernels_for(get_gpu("H100-96GB")), kernels_for(get_gpu("H100-80GB"))
    f = (358 / 558) / KNEE ** 2
    assert capped.matmul("bf16") == pytest.approx(0.803 * f, rel=1e-9)
    assert capped.attention["flash"] == pytest.approx(sxm.attention["flash"] * f, rel=1e-9)
    assert capped.hbm_fraction == sxm.hbm_fraction  # memory clock is not capped


def test_generations_without_a_floor_keep_the_cube_law():
    # A100 (GA100) is not listed in [voltage_floor]: a 300 W cap on the 400 W board takes ((300 - 61) / (400 - 61))^(1/3)
    assert voltage_floor("hopper") == KNEE and voltage_floor("ampere") == 0.0
    a100, capped = get_gpu("A100-80GB"), get_gpu("A100-80GB").with_power_limit(300)
    f = ((300 - 61) / (400 - 61)) ** (1 / 3)
    assert 61 + (400 - 61) * f ** 3 == pytest.approx(300)
    assert kernels_for(capped).matmul("bf16") == pytest.approx(kernels_for(a100).matmul("bf16") * f, rel=1e-9)
