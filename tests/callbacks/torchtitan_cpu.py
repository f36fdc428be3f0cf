"""torchtitan 0.2.2's own entry point and Trainer (torchtitan/train.py) on the CPU, with trainfit's hook:

    python tests/callbacks/torchtitan_cpu.py LOGS.json [torchtitan flags...]              # one process
    python -m torch.distributed.run --nproc-per-node 2 tests/callbacks/torchtitan_cpu.py LOGS.json [flags...]

runs `torchtitan.train.main(checked(Trainer))` (train.py:729) as `torchrun ... -m torchtitan.train` would, and
writes the hook's `trainfit_logs` and the layout it read to LOGS.json (rank 0) when the Trainer closes.

What forces CUDA, and the least patching that moves it to the CPU (no torchtitan source is changed):
- tools/utils.py:37 `device_type = _get_available_device_type() or "cuda"`: on a host without an accelerator the
  device type is "cuda", bound at import into tools/utils.py:42, components/metrics.py:21,
  distributed/parallel_dims.py:12 and distributed/utils.py:27. Set to "cpu" in those four modules: the Trainer then
  takes `cpu:LOCAL_RANK` (train.py:88), materialises the model on the CPU (train.py:188, :292), builds a CPU device
  mesh (parallel_dims.py:141) and a gloo process group (distributed/utils.py:326-331, the device's default backend).
- `device_module` (torch.cuda by the same line) is replaced by torch.cpu's functions plus the few torch.cpu lacks:
  DeviceMemoryMonitor (components/metrics.py:42-53, :65) asks the device's name, total memory and memory_stats
  (here: "cpu", the host's RAM, no statistics: torchtitan then logs -1 for its CUDA peak, which this run does not
  use; trainfit reads c10's CPU allocator records instead); set_pg_timeouts' barrier
  (distributed/utils.py:386) needs an integer device index, torch.cpu.current_device() is the string "cpu".
- FSDP over gloo (2 ranks): torchtitan turns FSDP's gradient division off (models/llama3/infra/parallelize.py:272-284,
  :360, set_gradient_divide_factor(1.0)), for which torch 2.13's FSDP2 reduce-scatters with ReduceOp.PREMUL_SUM(1/1)
  (fsdp/_fully_shard/_fsdp_collectives.py:846-850), an op gloo refuses ("Cannot use ReduceOp.PREMUL_SUM with
  Gloo"). The same function here also sets set_force_sum_reduction_for_comms(True) (_fully_shard.py:659): a SUM and
  a post-division by the factor 1.0, which _div_if_needed skips (_fsdp_collectives.py:866-877): the same gradients,
  the same buffers.
- The llama3 TrainSpec's tokenizer and data set are torchtitan's repository test assets, not in the wheel
  (components/tokenizer.py:431 hf_assets_path ./tests/assets/tokenizer; hf_datasets/text_datasets.py:42-43
  tests/assets/c4_test): the spec's build_tokenizer_fn is None (train.py:118-122 allows it) and its
  build_dataloader_fn yields random token batches of the job's local_batch_size x seq_len in the format
  batch_generator reads (train.py:401: (input_dict, labels))."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from types import SimpleNamespace


def cpu_device() -> None:
    """torchtitan's device type and device module on the CPU (see the module's docstring)."""
    import torch
    from torchtitan.components import metrics
    from torchtitan.distributed import parallel_dims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.tools import utils

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    module = SimpleNamespace(set_device=torch.cpu.set_device, current_device=lambda: 0,
                             synchronize=torch.cpu.synchronize, get_device_name=lambda device=None: "cpu",
                             get_device_properties=lambda device=None: SimpleNamespace(total_memory=ram),
                             reset_peak_memory_stats=lambda *a: None, empty_cache=lambda: None,
                             memory_stats=lambda device=None: {})
    for m in (utils, metrics, dist_utils):
        m.device_type, m.device_module = "cpu", module
    parallel_dims.device_type = "cpu"

    from torchtitan.models.llama3.infra import parallelize

    undivided = parallelize.disable_fsdp_gradient_division

    def summed(model):
        undivided(model)
        for m in model.modules():
            if hasattr(m, "set_force_sum_reduction_for_comms"):  # an FSDPModule
                m.set_force_sum_reduction_for_comms(True)

    parallelize.disable_fsdp_gradient_division = summed


def random_tokens(dp_world_size, dp_rank, tokenizer, job_config, **_):
    """Batches of random tokens of the job's shape, distinct per data-parallel rank (input, shifted labels)."""
    import torch

    t = job_config.training
    g = torch.Generator().manual_seed(1000 + dp_rank)
    out = []
    for _ in range(t.steps * max(1, t.global_batch_size // max(1, t.local_batch_size * dp_world_size))):
        x = torch.randint(0, 2048, (t.local_batch_size, t.seq_len + 1), generator=g)
        out.append(({"input": x[:, :-1]}, x[:, 1:]))
    return out


def main(path: str, flags: list[str]) -> None:
    sys.argv = [sys.argv[0], *flags]  # before the import: config/manager.py:46 binds sys.argv[1:] as a default
    import torch
    import torchtitan.protocols.train_spec as train_spec_module
    import torchtitan.train as tt

    from trainfit.callbacks.torchtitan import checked

    cpu_device()
    get = train_spec_module.get_train_spec
    train_spec_module.get_train_spec = lambda name: dataclasses.replace(
        get(name), build_tokenizer_fn=None, build_dataloader_fn=random_tokens)
    os.environ.setdefault("LOCAL_RANK", "0")  # a single process without torchrun: env:// of one rank
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))

    class Written(checked(tt.Trainer, steps=2)):
        def close(self):
            if torch.distributed.get_rank() == 0:
                s, world = self.trainfit.estimate.setup, torch.distributed.get_world_size()
                with open(path, "w") as f:
                    json.dump({**self.trainfit_logs, "steps_run": self.step, "world": world,
                               "layout": {"dp": s.dp, "zero": s.zero, "offload": s.offload, "stack": s.stack,
                                          "precision": s.precision, "recompute": s.recompute},
                               "params": sum(p.numel() for m in self.model_parts for p in m.parameters())}, f)
            super().close()

    tt.main(Written)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
