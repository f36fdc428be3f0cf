"""Run megatron-core 0.16.1's real MoELayer (TopKRouter, MoEAlltoAllTokenDispatcher, SequentialMLP) for one forward
and backward on CPU (gloo, world 1) and print, as JSON, the aten matmuls each pass dispatches and the dispatcher's
host synchronisations (token_dispatcher.py:897-899 d2h_event.synchronize) in each pass.

The CUDA stream API the dispatcher calls is replaced by stand-ins that count the event synchronisations, and
torch.cuda.current_device by "cpu" (router.py:88-92 moves a CPU router weight to it); moe_utils' te_general_gemm,
undefined without Transformer Engine, is set to None (moe_utils.py:1192 tests it). Usage: python
megatron_moe_cpu.py EXPERTS TOPK"""
import contextlib
import json
import os
import socket
import sys
import warnings
from collections import Counter

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

SYNCS = Counter()


class _Event:
    def synchronize(self):
        SYNCS["now"] += 1


class _Stream:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, s):
        pass

    def record_event(self, *a):
        return _Event()

    def __eq__(self, o):
        return isinstance(o, _Stream)

    def __hash__(self):
        return 0


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def main(experts: int, topk: int) -> dict:
    warnings.simplefilter("ignore")
    torch.cuda.Stream = _Stream
    torch.cuda.current_stream = lambda *a: _Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    import megatron.core.transformer.moe.moe_utils as mu
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig
    if not hasattr(mu, "te_general_gemm"):
        mu.te_general_gemm = None
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_moe_experts=experts,
                            moe_router_topk=topk, moe_ffn_hidden_size=32, moe_token_dispatcher_type="alltoall",
                            moe_grouped_gemm=False, gated_linear_unit=True, activation_func=F.silu,
                            add_bias_linear=False, moe_aux_loss_coeff=1e-3, use_cpu_initialization=True,
                            params_dtype=torch.float32)
    layer = MoELayer(cfg, get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False).submodules.mlp
                     .submodules)
    x = torch.randn(64, 1, 64, requires_grad=True)
    with _Count() as fwd:
        out, _ = layer(x)
    syncs_fwd = SYNCS["now"]
    with _Count() as bwd:
        out.float().sum().backward()
    return {"mm_forward": fwd.ops["mm"], "mm_backward": bwd.ops["mm"], "syncs_forward": syncs_fwd,
            "syncs_backward": SYNCS["now"] - syncs_fwd}


def saved_bytes(experts: int, topk: int, hiddens: list[int]) -> dict:
    """Per hidden size: the bytes autograd saves in one MoELayer forward (every saved storage once, the layer's
    parameters left out), on the setup main() builds (64 tokens, expert width 32, fp32)."""
    main(experts, topk)  # sets up the process group, the CPU stand-ins and parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig
    out = {}
    for h in hiddens:
        cfg = TransformerConfig(num_layers=1, hidden_size=h, num_attention_heads=4, num_moe_experts=experts,
                                moe_router_topk=topk, moe_ffn_hidden_size=32, moe_token_dispatcher_type="alltoall",
                                moe_grouped_gemm=False, gated_linear_unit=True, activation_func=F.silu,
                                add_bias_linear=False, moe_aux_loss_coeff=0.0, use_cpu_initialization=True,
                                params_dtype=torch.float32)
        layer = MoELayer(cfg, get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False).submodules.mlp
                         .submodules)
        params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        seen: dict = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = st
            return t

        x = torch.randn(64, 1, h, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, _ = layer(x)
        out[h] = sum(st.nbytes() for st in seen.values())
        del y
    return out


if __name__ == "__main__":
    if sys.argv[1] == "saved":  # saved EXPERTS TOPK H1 H2 ...
        print(json.dumps(saved_bytes(int(sys.argv[2]), int(sys.argv[3]), [int(a) for a in sys.argv[4:]])))
    else:
        print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
    torch.distributed.destroy_process_group()
