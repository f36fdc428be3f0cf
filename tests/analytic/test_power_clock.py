"""Power-capped SM clock (roofline.power_clock): C2's H100 runs at 500 W (calibration.md) while its MAMF fraction was
measured on the 700 W H100 SXM."""
import pytest

from trainfit.analytic.roofline import kernels_for, power_clock
from trainfit.hardware import get_gpu


def test_cap_clock_inverts_to_the_cap():
    # hand derivation: P = P_static + k f^3 with k fixed by the 700 W board at f = 1 (k = 700 - 142 = 558 W);
    # the clock that draws exactly 500 W, back-substituted, must give 500 W
    f = power_clock(500, 700, 142)
    assert 142 + 558 * f ** 3 == pytest.approx(500, rel=1e-9)
    assert f == pytest.approx(0.862, abs=1e-3)  # (358 / 558) ** (1/3) = 0.6416 ** (1/3)


def test_uncapped_boards_keep_their_fractions():
    assert power_clock(700, 700, 142) == 1.0 and power_clock(500, 0, 142) == 1.0
    assert kernels_for(get_gpu("H100-80GB")).matmul("bf16") == pytest.approx(0.803)  # MAMF 794.5 / 989


def test_grand_teton_h100_runs_slower_than_sxm():
    capped, sxm = kernels_for(get_gpu("H100-96GB")), kernels_for(get_gpu("H100-80GB"))
    assert capped.matmul("bf16") == pytest.approx(0.803 * 0.862, rel=1e-3)
    assert capped.attention["flash"] == pytest.approx(sxm.attention["flash"] * 0.862, rel=1e-3)
    assert capped.hbm_fraction == sxm.hbm_fraction  # memory clock is not capped
