"""torchtitan's own training step (`--stack torchtitan`), shared by the measure and trace engines.

Runs torchtitan's code, not a re-implementation: its Llama3 `Transformer` (its qwen3, deepseek_v3 and llama4 MoE models,
with their own parallelize order and expert parallelism, for the measure engine: step/torchtitan_moe.py), its
activation checkpointing (`apply_ac` with its `_op_sac_save_list`), its `apply_fsdp` / `apply_ddp`, its
`maybe_enable_amp`, its loss and its gradient clipping. Paths below are inside the torchtitan 0.2.2 wheel
(stacks/torchtitan.toml pins it).

    build   train.py:147-151   Transformer(args) on the meta device under set_default_dtype(training.dtype)
            train.py:154-155   --low-precision: torchao's Float8Linear swapped in (step/torchtitan_lowp.py)
            train.py:254       parallelize_llama: models/llama3/infra/parallelize.py:111-119 apply_ac, then
                               :125-156 apply_fsdp (dp_shard > 1) or apply_ddp (dp_replicate > 1)
            train.py:256-259   to_empty(device), init_weights(buffer_device=None), train()
    step    train.py:560-573   valid-token count (labels != IGNORE_INDEX), .float() without data parallelism
            train.py:530-542   with maybe_enable_amp: pred = model(inputs); loss = cross_entropy_loss(pred,
                               labels) / global_valid_tokens; then `del pred`; loss.backward()
            train.py:590       accumulated_losses.append(loss.detach())
            train.py:592-600   clip_grad_norm_(params, training.max_norm, foreach=True); optimizers.step()
                               (max_norm: Setup.grad_clip_norm, --max-grad-norm or the stack's 1.0)
                               (lr_schedulers.step() at :601 touches no tensor)
            train.py:550       optimizers.zero_grad() (set_to_none, torch's default). torchtitan calls it first
                               in each step; we call it last, in the previous step: the same sequence of steps,
                               cut one call later, so that a step starts without gradients as trainfit's engines
                               measure it (c10 does not report the CPU profiler a free of memory allocated before
                               it started, trainfit/measure/cpu_peak.py: freeing the last step's gradients inside
                               the profiled step would go unseen).

Batches mirror torchtitan's text dataloader (hf_datasets/text_datasets.py:113-130): a window of seq + 1 token ids,
input = x[:-1], label = x[1:], collated by torch's default collate into two (batch, seq) int64 tensors.
The optimizer is trainfit's `make_optimizer` (the stack's fused AdamW, stacks/torchtitan.toml [optimizer_impl]).
"""
from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Callable

import torch

from ..errors import EngineUnavailableError
from .build import param_dtype
from .fake_moves import fake_safe_module_moves
from .standard import _is_real, make_optimizer
from . import torchtitan_lowp, torchtitan_moe

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup
    from ..spec import ModelSpec

# torchtitan's mixed_precision_param (config/job_config.py:282: bfloat16 | float32) and training.dtype
# (job_config.py:275: float32 | bfloat16) for each trainfit precision it can run.
PRECISIONS = {"fp32": "float32", "amp-bf16": "bfloat16", "bf16": "bfloat16"}
NOTE = ("stack torchtitan 0.2.2: its own Transformer (llama3; MoE models: qwen3, deepseek_v3, llama4), apply_ac, "
        "apply_fsdp/apply_ddp, maybe_enable_amp, cross_entropy_loss and clip_grad_norm_ (trainfit/step/torchtitan.py)")
check_low_precision = torchtitan_lowp.check  # --low-precision: torchao's Float8Linear recipes (engines.py)
DDP_TAKES_MESH = True  # models/llama3/infra/parallelize.py:363-366 (apply_ddp(model, dp_mesh, ...))
EXPERT_PARALLEL = True  # its MoE models' own expert parallelism (step/torchtitan_moe.py parallelize)
# how torchtitan applies data parallelism for each --zero it runs (models/llama3/infra/parallelize.py:125-156)
STRATEGIES = {0: "torchtitan apply_ddp (composable replicate, 100 MB buckets)",
              2: "torchtitan apply_fsdp, reshard_after_forward_policy never (ZeRO-2-like)",
              3: "torchtitan apply_fsdp, reshard_after_forward_policy default (FULL_SHARD; the final norm and output kept gathered)"}


def _missing(e: ImportError) -> EngineUnavailableError:
    return EngineUnavailableError(f"--stack torchtitan needs torchtitan 0.2.2 ({e.name} is missing): "
                                  "pip install 'trainfit[torchtitan]'")


def check_ranks(spec: "ModelSpec", setup: "Setup") -> None:
    """The distributed measure's refusals: trainfit's strategy checks, then torchtitan's own (check)."""
    from .strategy import check_strategy

    check_strategy(setup)
    check(spec, setup)


def check(spec: "ModelSpec", setup: "Setup") -> None:
    """One-line refusals for what torchtitan's llama3 model and step do not run."""
    from ..analytic.layout import check_stack_model

    check_stack_model(spec, setup)  # the models torchtitan builds: the same refusal for every engine
    if spec.is_moe:  # torchtitan's qwen3 / deepseek_v3 / llama4 MoE models (step/torchtitan_moe.py)
        torchtitan_moe.check(spec, setup)
    # (precisions and optimizers torchtitan lacks never reach here: Setup refuses them from stacks/torchtitan.toml)
    if setup.attention == "eager":
        raise EngineUnavailableError("--attention eager: torchtitan's llama3 attention is SDPA (attn_type sdpa, "
                                     "models/llama3/model/args.py:45); use --attention auto, sdpa or flash")
    if setup.tp > 1 or setup.pp > 1:
        raise EngineUnavailableError("--stack torchtitan: the trace and measure engines run data parallelism only; "
                                     "--tp/--pp are analytic-only")
    if setup.compile:  # (the trace refuses it first, engines.trace)
        raise EngineUnavailableError("--compile: trainfit's torchtitan step runs eager (torchtitan's apply_compile of "
                                     "each block and of the loss is not applied here); use --engine analytic, which "
                                     "models the compiled step")


def ffn_sizing(dim: int, intermediate: int) -> tuple[int, float | None]:
    """(multiple_of, ffn_dim_multiplier) for which torchtitan's FeedForward sizing gives `intermediate`
    exactly. torchtitan: hidden = int(2 * 4 * dim / 3); if ffn_dim_multiplier: hidden = int(m * hidden); then
    rounded up to a multiple of multiple_of (models/llama3/model/model.py:332-336, hidden_dim = 4 * dim at :378).
    Prefers the plain power-of-two multiple_of torchtitan's own flavours use; else multiple_of = intermediate."""
    base = int(2 * (4 * dim) / 3)
    for m in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        if _ffn_hidden(dim, m, None) == intermediate:
            return m, None
    mult = None if base <= intermediate else intermediate / base
    if _ffn_hidden(dim, intermediate, mult) != intermediate:
        raise EngineUnavailableError(f"--stack torchtitan: no multiple_of/ffn_dim_multiplier gives torchtitan's FFN "
                                     f"width {intermediate} for dim {dim}")
    return intermediate, mult


def _ffn_hidden(dim: int, multiple_of: int, multiplier: float | None) -> int:
    hidden = int(2 * (4 * dim) / 3)  # model.py:332
    if multiplier is not None:
        hidden = int(multiplier * hidden)  # model.py:334-335
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)  # model.py:336


def model_args(spec: "ModelSpec", setup: "Setup"):
    """torchtitan's TransformerModelArgs for `spec` (models/llama3/model/args.py:27-47)."""
    try:
        from torchtitan.models.llama3 import TransformerModelArgs
        from torchtitan.models.llama3.model.args import RoPEScalingArgs
    except ImportError as e:
        raise _missing(e) from e
    check(spec, setup)
    from ..models.hf_config import rope_parameters

    cfg = spec.config
    theta, kind, rope = rope_parameters(cfg)
    if kind == "llama3":
        scaling = RoPEScalingArgs(scaling_factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
                                  high_freq_factor=float(rope["high_freq_factor"]),
                                  original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
    else:
        # scaling_factor 1 makes torchtitan's llama3 frequency scaling (model.py:66-85) the identity.
        # NB: other HF rope types (linear, yarn...) run unscaled here: different values, the same memory.
        scaling = RoPEScalingArgs(scaling_factor=1.0)
    multiple_of, multiplier = ffn_sizing(spec.hidden, spec.intermediate)
    return TransformerModelArgs(
        dim=spec.hidden, n_layers=spec.layers, n_heads=spec.heads, n_kv_heads=spec.kv_heads, vocab_size=spec.vocab,
        multiple_of=multiple_of, ffn_dim_multiplier=multiplier, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling_args=scaling,
        max_seq_len=setup.seq,  # args.py:55 (update_from_config: max_seq_len = training.seq_len)
    )


def parallel_dims(setup: "Setup"):
    """torchtitan's ParallelDims for `setup` (no meshes built): zero 0 = dp_replicate (DDP), zero 2/3 = dp_shard;
    expert parallelism over dp_shard's ranks (etp 1)."""
    from torchtitan.distributed import ParallelDims

    shard = setup.dp if setup.zero >= 2 else 1
    return ParallelDims(dp_replicate=setup.dp // shard, dp_shard=shard, cp=1, tp=1, pp=1, ep=setup.ep, etp=1,
                        world_size=setup.dp)


def ac_config(setup: "Setup"):
    """torchtitan's ActivationCheckpoint config for `setup.recompute` (config/job_config.py:651-655), None for none."""
    from torchtitan.config.job_config import ActivationCheckpoint

    r = setup.recompute
    if r == "none":
        return None
    if r == "full":
        return ActivationCheckpoint(mode="full")
    if r == "op":
        return ActivationCheckpoint(mode="selective", selective_ac_option="op")
    if r.startswith("layer:"):
        return ActivationCheckpoint(mode="selective", selective_ac_option=str(setup.layers_every))
    raise EngineUnavailableError(f"--recompute {r} is not a torchtitan policy (none, full, op, layer:N)")


def apply_recompute(model: torch.nn.Module, setup: "Setup", save_list: set) -> None:
    """torchtitan's apply_ac with the model's save list (llama3's: models/llama3/infra/parallelize.py:111-119)."""
    config = ac_config(setup)
    if config is None:
        return
    from torchtitan.distributed import activation_checkpoint as ac

    # layer:N counts blocks in a module global (distributed/activation_checkpoint.py:24,37-40) that torchtitan's
    # one apply_ac per process starts at 0; we build several models per process, so start it at 0 each time.
    ac._layer_sac_count = 0
    ac.apply_ac(model, config, model_compile_enabled=False, op_sac_save_list=save_list)


def apply_data_parallel(model: torch.nn.Module, setup: "Setup", mesh) -> None:
    """parallelize.py:125-156: apply_fsdp for zero 2 (reshard policy "never") / 3 ("default", no PP: reshard after
    forward), with MixedPrecisionPolicy(param_dtype = mixed_precision_param, reduce_dtype = float32)
    (job_config.py:282-290, parallelize.py:313); apply_ddp (composable replicate, 100 MB buckets) for zero 0."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.models.llama3.infra.parallelize import apply_ddp, apply_fsdp

    if setup.zero == 0:
        apply_ddp(model, mesh, enable_compile=False)
        return
    if setup.zero not in (2, 3):
        raise EngineUnavailableError(f"--zero {setup.zero} is not run by --stack torchtitan (0: DDP, 2, 3: FSDP2)")
    apply_fsdp(model, mesh, param_dtype=TORCH_DTYPE_MAP[PRECISIONS[setup.precision]],
               reduce_dtype=torch.float32, pp_enabled=False, cpu_offload=False,
               reshard_after_forward_policy=reshard_policy(setup))
    sum_on_gloo(model, setup)


def reshard_policy(setup: "Setup") -> str:
    """apply_fsdp's reshard_after_forward_policy: zero 3 "default" (no PP: reshard after forward), zero 2 "never"."""
    return "default" if setup.zero == 3 else "never"


def sum_on_gloo(model: torch.nn.Module, setup: "Setup") -> None:
    """FSDP2's gradient reduction as gloo runs it (below)."""
    if setup.device == "cpu":
        # apply_fsdp sets the gradient divide factor to 1.0 (parallelize.py:359-360), which FSDP2 reduces with
        # ReduceOp.PREMUL_SUM(1.0) (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
        # _get_gradient_divide_factors); gloo, trainfit's CPU backend, has no PREMUL_SUM. Multiplying by 1 before a
        # sum is a sum: force_sum_reduction gives ReduceOp.SUM in the same buffers, no division (factor 1).
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)


def python_held(setup: "Setup") -> bool:
    """Whether every buffer the step keeps is a tensor Python holds (measure/worker.py): FSDP2's are; DDP's Reducer
    keeps its buckets in C++. gloo's worker threads drop the last reference to an expert-parallel all-to-all's input
    after the caller (distributed/expert_parallel.py:138-143, :175-180), a free the profiler never sees."""
    return setup.zero >= 2


trace_notes = torchtitan_moe.trace_notes  # the distributed trace's line on the routing it assumes


def build(spec: "ModelSpec", setup: "Setup", device="cpu", mesh=None, fake: bool = False) -> torch.nn.Module:
    """torchtitan's model for `spec`, checkpointed and (setup.dp > 1) sharded or replicated over `mesh` (default: a
    1-D mesh over the default process group), materialised on `device` with torchtitan's init, in train mode.

    fake=True (the trace engine, under FakeTensorMode): the model is created on `device` directly and torchtitan's
    init_weights (values only) is skipped -- FakeTensorMode cannot swap meta parameters for fake ones in to_empty,
    and trunc_normal_ reads a tensor value; the parameters, buffers and wrappers are the same. Where the step reads
    the router's counts (the expert all-to-all's splits, gpt_oss's expert biases) the fake model takes the routing
    setting's (torchtitan_moe.routed_dispatch, known_expert_rows)."""
    if spec.is_moe:
        model_class, args = torchtitan_moe.model_and_args(spec, setup)
        save_list = torchtitan_moe.op_sac_save_list(spec, setup)
    else:
        from torchtitan.models.llama3 import Transformer
        from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list as save_list

        model_class, args = Transformer, model_args(spec, setup)
    from torchtitan.tools.utils import set_default_dtype

    # (fake_safe_module_moves: gpt_oss casts each block as it builds it, which torch cannot do on fake parameters;
    # NB: its MoE's two fp32 count buffers, which init_weights, skipped on fake tensors, makes again in fp32
    # (models/moe/moe.py:567-574), stay cast: 16 bytes an expert a layer low)
    with torch.device(device if fake else "meta"), set_default_dtype(param_dtype(setup)), fake_safe_module_moves():
        model = model_class(args)  # train.py:147-151
    torchtitan_lowp.convert(model, setup, spec.layers)  # train.py:153-155: the model converters, before parallelize
    if fake and spec.is_moe:
        torchtitan_moe.known_expert_rows(model, spec, setup)
    if setup.dp > 1 and mesh is None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise EngineUnavailableError(f"--stack torchtitan --dp {setup.dp}: one process runs one rank without its "
                                         f"peers; measure with `trainfit measure --nproc {setup.dp}` (torchrun) or "
                                         "use --engine trace (a fake process group)")
    if spec.is_moe:  # its model's parallelize: experts, then recompute, then data parallelism (step/torchtitan_moe.py)
        torchtitan_moe.parallelize(model, spec, setup, torch.device(device).type, save_list)
    else:
        apply_recompute(model, setup, save_list)
        if setup.dp > 1:
            if mesh is None:
                from torch.distributed.device_mesh import init_device_mesh

                mesh = init_device_mesh(torch.device(device).type, (torch.distributed.get_world_size(),))
            apply_data_parallel(model, setup, mesh)
    if not fake:
        model.to_empty(device=device)  # train.py:256-259
        with torch.no_grad():
            model.init_weights(buffer_device=None)
    model.train()
    return model


def wrap(model: torch.nn.Module, setup: "Setup", device_type: str = "cpu", device_index=None, mesh=None):
    """(model, optimizer): `build` already applied torchtitan's data parallelism (train.py:254), so this only makes
    the optimizer, after parallelisation as torchtitan does (train.py:275)."""
    return model, make_optimizer(model, setup)


def make_batches(spec: "ModelSpec", setup: "Setup", device="cpu") -> list[dict]:
    """`setup.grad_accum` micro-batches {input, labels} as torchtitan's dataloader yields them (module docstring)."""
    batches = []
    for _ in range(setup.grad_accum):
        x = torch.randint(0, spec.vocab, (setup.batch, setup.seq + 1), dtype=torch.long, device=device)
        batches.append({"input": x[:, :-1].clone(), "labels": x[:, 1:].clone()})  # collate: fresh tensors
    return batches


def _device_type(model: torch.nn.Module, setup: "Setup") -> str:
    t = next(model.parameters()).device.type
    return t if t in ("cpu", "cuda") else setup.device


def amp_context(setup: "Setup", device_type: str):
    """torchtitan's own maybe_enable_amp (distributed/utils.py:243-263): nothing under FSDP (fully_shard casts), else
    torch.autocast(device_type, mixed_precision_param). On CPU, autocast to float32 is refused by torch with a
    warning and runs disabled (torch/amp/autocast_mode.py), which is what torchtitan gets there too."""
    from torchtitan.distributed import utils as dist_utils

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dist_utils.maybe_enable_amp(parallel_dims(setup), PRECISIONS[setup.precision], device_type)


def run_step(model, optimizer, batches, setup: "Setup", phase: Callable[[str], None] = lambda name: None) -> float:
    """One torchtitan train_step (module docstring). Returns the summed loss, or nan on fake/meta tensors."""
    from torchtitan.components.loss import IGNORE_INDEX
    from torchtitan.distributed import utils as dist_utils

    # train.py:560-568 counts on the host's labels, then moves the count to the device; our batches already live on
    # the device, so the count starts there (a host counter += a CUDA sum fails: seen on an H200)
    local_valid_tokens = torch.zeros((), dtype=torch.int64, device=batches[0]["labels"].device)
    for b in batches:
        local_valid_tokens += (b["labels"] != IGNORE_INDEX).sum()
    if setup.dp > 1:
        # train.py:571: dist_sum all-reduces the count and returns a Python float (.item(), which fake tensors
        # cannot run). NB: our labels have no IGNORE_INDEX, so the global count is known; the one-scalar
        # all-reduce is not run (8 bytes, no effect on the peak).
        global_valid_tokens = float(setup.batch * setup.seq * setup.grad_accum * setup.dp)
    else:
        global_valid_tokens = local_valid_tokens.float()  # train.py:573
    amp = amp_context(setup, _device_type(model, setup))
    accumulated_losses = []
    for b in batches:
        loss = _forward_backward(model, b, global_valid_tokens, amp, phase, setup)
        accumulated_losses.append(loss.detach())  # train.py:590
    phase("optimizer")
    dist_utils.clip_grad_norm_([p for p in model.parameters()], setup.grad_clip_norm, foreach=True, pp_mesh=None,
                               ep_enabled=setup.ep > 1)  # train.py:592-598
    optimizer.step()  # train.py:600
    optimizer.zero_grad()  # train.py:550, the next step's first call (module docstring)
    phase("end")
    total = torch.sum(torch.stack(accumulated_losses))  # train.py:604
    return total.item() if _is_real(total) else math.nan


def _forward_backward(model, batch, global_valid_tokens, amp, phase, setup):
    """train.py:528-545 (forward_backward_step, no pipeline parallelism)."""
    from torchtitan.components.loss import cross_entropy_loss

    phase("forward")
    with torchtitan_moe.kernels(model, setup):
        with amp:  # train.py:531-538
            pred = model(batch["input"], **torchtitan_moe.forward_kwargs(model, batch["input"]))
            loss_sum = cross_entropy_loss(pred, batch["labels"])
            loss = loss_sum / global_valid_tokens
        del pred  # train.py:541 ("need to free pred before bwd to avoid peaking memory")
        phase("backward")
        loss.backward()  # train.py:542
    return loss


def prepare(spec: "ModelSpec", setup: "Setup", device="cpu"):
    """(model, optimizer, batches) in steady state, one warm-up step run (optimizer state resident)."""
    model = build(spec, setup, device=device)
    optimizer = make_optimizer(model, setup)
    batches = make_batches(spec, setup, device=device)
    run_step(model, optimizer, batches, setup)
    return model, optimizer, batches

