"""Board power at the achieved utilisation (analytic/energy.py) and the token budget built on it (timing.budget)."""

import pytest

import trainfit
from trainfit.analytic.energy import average_power, static_watts
from trainfit.analytic.timing import budget
from trainfit.data import load_toml
from trainfit.hardware import get_gpu


def test_hand_derived_budget_on_a100():
    """A100-80GB: TDP 400 W (NVIDIA A100 datasheet, SXM4), 61 W at P0 and 0 % (nvidia-smi, allenai/PeerRead#40).
    A 1 s step: compute 0.6 s, optimizer 0.1 s busy; tp_comm 0.1 s and bubble 0.2 s waiting -> busy share 0.7.
    P = 61 + (400 - 61) × 0.7 = 61 + 237.3 = 298.3 W.
    1e9 tokens at 1e5 tokens/s = 1e4 s on 8 GPUs = 80,000 GPU-s = 22.2222 GPU-h; energy = 22.2222 × 0.2983 kWh
    = 6.62889 kWh (TDP × time would say 8.8889 kWh)."""
    gpu = get_gpu("A100-80GB")
    step = {"compute": 0.6, "recompute": 0.0, "tp_comm": 0.1, "bubble": 0.2, "optimizer": 0.1,
            # not terms of the step: must be ignored
            "step_seconds": 1.0, "tokens_per_second": 1e5, "mfu": 0.4, "hfu": 0.45, "dp_comm_total": 3.0,
            "dp_bandwidth": "inter", "efficiency": 0.615, "a_ratio_added_later": 0.5}
    assert average_power(gpu, step) == pytest.approx(298.3, rel=1e-12)
    b = budget(1e9, 1e5, 8, gpu, step)
    assert b["gpu_hours"] == pytest.approx(22.22222222, rel=1e-8)
    assert b["energy_kwh"] == pytest.approx(6.628888889, rel=1e-8)
    assert b["average_power_watts"] == pytest.approx(298.3)
    assert set(b) >= {"train_tokens", "train_seconds", "gpu_hours", "cost_usd", "energy_kwh"}


def test_no_terms_is_the_tdp_upper_bound():
    gpu = get_gpu("H100-80GB")
    assert budget(1e9, 1e5, 8, gpu)["energy_kwh"] == pytest.approx(1e4 * 8 / 3600 * 0.7)


def test_communication_heavy_layout_draws_less_than_tdp(tmp_path):
    """llama-3.1-8b on 16 H100s as dp 8 × tp 2, 2,048 tokens per rank, on nodes with one 100 Gb/s NIC for their 8
    GPUs: the data-parallel ring leaves the node over it, so exposed DP communication is most of the step and the
    boards wait at their static power for it. (On DGX H100 nodes, 8 rails of 400 Gb/s, it is 6 % of the step: not
    the premise this test needs.)"""
    slow = tmp_path / "one_nic.toml"
    slow.write_text("gpus_per_node = 8\nnics = 1\nnic_bandwidth = 12.5e9\nnvls = true\n")
    e = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", dp=8, tp=2, batch=1, seq=2048, tokens=1e12,
                          cluster=str(slow))
    t, st = e.time, e.detail.step_time
    assert st.dp_comm > 0.5 * st.step_seconds  # the premise: communication-heavy
    # at most half the step busy: P < 142 + (700 − 142) × 0.5 = 421 W (H100: TDP 700 W, P0 idle 142 W)
    assert t.energy_kwh < t.gpu_hours * 421 / 1000 < t.gpu_hours * 700 / 1000  # below GPU-hours × TDP
    assert t.average_power_watts > 142


def test_mfu_override_counts_the_bubble_as_waiting():
    """--mfu with pp 4, vpp 1, accum 4: bubble = (4 − 1)/4 of the compute (Narayanan et al. 2021 eq. 1), so the
    busy share is 1/1.75 and P = 142 + 558/1.75 = 460.857 W on an H100 (TDP 700 W, static 142 W)."""
    e = trainfit.estimate("llama-3.1-8b", gpu="H100-80GB", pp=4, grad_accum=4, mfu=0.4, tokens=1e12,
                          stack="megatron")
    assert e.time.average_power_watts == pytest.approx(142 + 558 / 1.75, rel=1e-9)


def test_power_data_names_catalog_gpus_below_their_tdp():
    raw = load_toml("power.toml")["static"]  # each reading's source: tests/test_data_provenance.py
    for name, entry in raw.items():
        gpu = get_gpu(name)  # raises on a name the catalog does not know
        assert 0 < entry["watts"] < gpu.power_watts
    # a GPU without a reading gets the median static/TDP ratio of the measured ones
    ratios = sorted(v["watts"] / get_gpu(n).power_watts for n, v in raw.items())
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    assert static_watts(get_gpu("L4")) == pytest.approx(median * 72)
