"""A real lightning.Trainer (2.6.6) under its FSDP strategy on CPU ranks over gloo, with trainfit's callback:

    python -m torch.distributed.run --nproc-per-node 2 tests/callbacks/lightning_fsdp_cpu.py OUT.json [SHARDING]
        [offload]

Lightning refuses FSDP on the CPU by the strategy's exact class: trainer/connectors/accelerator_connector.py:431-438
raises "The strategy `fsdp` requires a GPU accelerator" when the flag is the string "fsdp" or `type(flag) is
FSDPStrategy`. A subclass that changes nothing (`CPUFSDPStrategy` below) is not that class, so the Trainer takes it;
the rest is Lightning's own path: strategies/fsdp.py:253-275 (the process group's backend is the device's default,
gloo for the CPU; device_id None on the CPU, :265) and torch's FullyShardedDataParallel (FSDP1) around the module
(:305-316). Under torchrun Lightning launches nothing itself (TorchElasticEnvironment). Rank 0 writes the callback's
logs and the layout it read to OUT.json."""
from __future__ import annotations

import json
import sys


def main(path: str, sharding: str = "FULL_SHARD", offload: bool = False) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.strategies import FSDPStrategy
    from lightning_tiny import token_batches, tiny_module_class

    from trainfit.callbacks.lightning import TrainfitLightningCallback

    class CPUFSDPStrategy(FSDPStrategy):
        """Lightning's FSDPStrategy, unchanged (see the module's docstring)."""

    class Tiny(tiny_module_class(L, config=True)):
        def configure_model(self):
            """Wrapped here, as Lightning lets a module wrap itself (fsdp.py:297: an FSDP inside, Lightning's own
            wrap skipped), with the strategy's sharding and offload and device_id cpu: torch's FSDP1 refuses a CPU
            module without a device_id (fsdp/_init_utils.py:376-392), and Lightning passes the root device's index,
            None on the CPU (fsdp.py:315)."""
            from torch.distributed.fsdp import FullyShardedDataParallel
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer

            s = self.trainer.strategy  # a unit per decoder layer and the root, as transformers' auto-wrap policy
            self.model = FullyShardedDataParallel(self.model, sharding_strategy=s.sharding_strategy,
                                                  cpu_offload=s.cpu_offload, device_id=torch.device("cpu"),
                                                  auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
                                                  use_orig_params=True)

    data = token_batches()
    cb = TrainfitLightningCallback(steps=2)
    strategy = CPUFSDPStrategy(sharding_strategy=sharding, cpu_offload=offload)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[cb])
    trainer.fit(Tiny(), data)
    if trainer.is_global_zero:
        s = cb.preflight.estimate.setup
        with open(path, "w") as f:
            json.dump({**cb.logs, "global_step": trainer.global_step, "world": trainer.world_size,
                       "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                       "layout": {"dp": s.dp, "zero": s.zero, "offload": s.offload, "stack": s.stack,
                                  "precision": s.precision}}, f)


if __name__ == "__main__":
    main(sys.argv[1], *(sys.argv[2:3] or ["FULL_SHARD"]), offload="offload" in sys.argv[3:])
