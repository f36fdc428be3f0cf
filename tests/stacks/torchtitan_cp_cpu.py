"""Two gloo ranks on CPU: torchtitan's context parallelism (apply_cp_to_attention_module, cp_shard head-tail) on one
causal SDPA, each rank printing whether torch's ring ran and its error against the unsharded attention. Run by
tests/stacks/test_torchtitan_cp_cpu.py under torch.distributed.run."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torchtitan.distributed.context_parallel import apply_cp_to_attention_module, cp_shard
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
class Attn(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
m = Attn()
try:
    apply_cp_to_attention_module([m], mesh, "sdpa")
    (qs, ks, vs), _ = cp_shard(mesh, (q, k, v), None, "headtail", input_seq_dim=2)
    out = m(qs, ks, vs)
    (rs,), _ = cp_shard(mesh, (ref,), None, "headtail", input_seq_dim=2)
    print(rank, "ran", type(out).__name__, tuple(out.shape), "max err", (out - rs).abs().max().item())
except Exception as e:
    print(rank, "error", type(e).__name__, str(e)[:300])
dist.destroy_process_group()
