"""The layout the Lightning callback reads from a real lightning.Trainer's live FSDP and DeepSpeed strategies
(Lightning 2.6.6), without stepping: the expectations are written from the arguments given to Lightning (its FSDP
sharding strategy and CPUOffload, the ZeRO block its DeepSpeed strategy builds), not from trainfit's reader.

Why not stepped here:
- DeepSpeed: Lightning refuses every accelerator but CUDA when the run starts (strategies/deepspeed.py:341-346,
  setup_environment: "The DeepSpeed strategy is only supported on CUDA GPUs"); the Trainer itself is built, so its
  strategy is read live.
- FSDP: Lightning refuses `strategy="fsdp"` and `FSDPStrategy(...)` with a CPU accelerator when the Trainer is built
  (trainer/connectors/accelerator_connector.py:431-438, by the exact class); a subclass that changes nothing is
  taken, and steps for real on 2 CPU ranks in test_callbacks_trainers.py (heavy)."""
from __future__ import annotations

import pytest

L = pytest.importorskip("lightning")
pytest.importorskip("torch")

from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy  # noqa: E402

from trainfit.callbacks.lightning import trainer_settings  # noqa: E402


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy, unchanged: not `type(...) is FSDPStrategy` (accelerator_connector.py:432)."""


def _trainer(strategy, precision="32-true", devices=2):
    return L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, precision=precision, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _read(cases):
    for strategy, precision, (dp, zero, offload, stack, prec) in cases:
        trainer = _trainer(strategy, precision)
        assert trainer.strategy is strategy and trainer.world_size == 2
        _, run = trainer_settings(trainer)
        got = (run["dp"], run["zero"], run.get("offload"), run.get("stack"), run.get("precision"))
        assert got == (dp, zero, offload, stack, prec), (type(strategy).__name__, precision, run)
        assert run.get("fsdp_version") == (1 if stack is None else None)  # Lightning wraps with FSDP1 (fsdp.py:310)


def test_lightning_live_fsdp_strategies_read_as_their_layout():
    with pytest.raises(ValueError, match="requires a GPU accelerator"):  # accelerator_connector.py:431-438
        _trainer(FSDPStrategy())
    _read([  # (strategy, precision, (dp, zero, offload, stack, precision))
        (CPUFSDPStrategy(), "32-true", (2, 3, None, None, None)),  # FULL_SHARD: Lightning's default (fsdp.py:161)
        (CPUFSDPStrategy(sharding_strategy="SHARD_GRAD_OP"), "32-true", (2, 2, None, None, None)),
        (CPUFSDPStrategy(cpu_offload=True), "32-true", (2, 3, "params", None, None)),  # CPUOffload(offload_params)
    ])


def test_lightning_live_deepspeed_strategies_read_as_their_layout():
    pytest.importorskip("deepspeed")  # Lightning's DeepSpeedStrategy refuses to be built without it
    _read([
        (DeepSpeedStrategy(stage=2), "32-true", (2, 2, None, "deepspeed", "fp32")),
        # Lightning adds the bf16 block when the run starts (fabric/strategies/deepspeed.py:948-950)
        (DeepSpeedStrategy(stage=2), "bf16-mixed", (2, 2, None, "deepspeed", "bf16-master")),
        (DeepSpeedStrategy(stage=3, offload_optimizer=True), "16-mixed", (2, 3, "optimizer", "deepspeed",
                                                                          "fp16-master")),
        (DeepSpeedStrategy(stage=3, offload_optimizer=True, offload_parameters=True), "32-true",
         (2, 3, "params", "deepspeed", "fp32")),
    ])


def test_lightning_unmodelled_fsdp_sharding_is_refused_in_one_line():
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match="no_shard"):  # FSDP's NO_SHARD: trainfit models full_shard, shard_grad_op
        trainer_settings(_trainer(CPUFSDPStrategy(sharding_strategy="NO_SHARD")))
