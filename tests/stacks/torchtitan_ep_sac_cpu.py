"""Two gloo ranks on CPU: torchtitan's qwen3 MoE model (a tiny config) under expert parallelism 2 and FSDP over both
ranks with per-op SAC, parallelized by torchtitan's own apply_moe_ep_tp, apply_ac and apply_fsdp (trainfit's
step/torchtitan_moe.parallelize calls them in its parallelize order), each rank printing whether a step ran or its
error. Run by tests/stacks/test_torchtitan_moe.py under torch.distributed.run."""
import sys

import torch
import torch.distributed as dist

from tests.stacks.test_torchtitan_moe import setup, spec
from trainfit.step import torchtitan as step
from trainfit.step import torchtitan_moe

dist.init_process_group("gloo")
rank = dist.get_rank()
sp, s = spec("qwen3"), setup(dp=2, ep=2, zero=3, recompute="op", moe_force_balance=True)
model_class, args = torchtitan_moe.model_and_args(sp, setup())  # (check() refuses s itself)
with torch.device("meta"):
    model = model_class(args)
torchtitan_moe.parallelize(model, sp, s, "cpu", torchtitan_moe.op_sac_save_list(sp, s))
model.to_empty(device="cpu")
with torch.no_grad():
    model.init_weights(buffer_device=None)
try:
    batches = step.make_batches(sp, s)
    step.run_step(model, step.make_optimizer(model, s), batches, s)
    line = f"{rank} ran"
except Exception as e:  # noqa: BLE001 - the error is the result
    line = f"{rank} error {type(e).__name__} {str(e)[:300]}"
# one write of the whole line (under PIPE_BUF: atomic on the shared pipe, where two prints could interleave)
sys.stdout.write(line + "\n")
sys.stdout.flush()
dist.destroy_process_group()
