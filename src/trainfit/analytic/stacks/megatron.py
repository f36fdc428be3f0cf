"""The megatron stack (Megatron-Core 0.16.1 as Megatron-LM's pretrain_gpt.py drives it): its own DDP over a
contiguous grad buffer and its own optimizer over fp32 main params (no torch DDP/FSDP2, no torch.optim per
parameter), Transformer Engine layers with their own memory model, its parameter tensors, its clip and process
groups. Its facts are stacks/megatron.toml."""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from ...errors import SetupError
from ...stacks.megatron import moe_overlap_mtp
from .. import grad_clip, megatron_offload, megatron_recompute, te_recipes
from ..megatron_loss import largest_block
from ..megatron_memory import rank_states, saved_floors, stage_memory
from ..mtp import mtp_layers
from ..memory import TrainMemory
from ..parallel.megatron import FP32, grad_buffer_bytes, megatron_tensors, shards
from .base import StackModel


class MegatronModel(StackModel):
    torch_data_parallel = False  # distributed/distributed_data_parallel.py (contiguous param_and_grad_buffer)
    torch_optimizer = False  # optimizer/optimizer.py, distrib_optimizer.py (fp32 main params, FusedAdam)
    # megatron_memory.py models GPTModel's TransformerLayers only, not MambaModel's Mamba-2 layers (megatron-core
    # 0.16.1 ssm/mamba_layer.py, ssm/mamba_mixer.py, which Megatron-LM's pretrain_mamba.py builds)
    hybrid_blocks = False

    def stage_memory(self, spec, setup, pc, st, stage):
        """Megatron-Core's own states, TE layers and recompute (analytic/megatron_memory.py)."""
        return stage_memory(spec, setup, pc, stage, TrainMemory)

    def states_floor(self, spec, setup, pc, stage) -> int:
        """The optimizer step's states: what stage_memory's resident bytes (weights, the master weights less the
        step's fp32 grad copies, the optimizer states, the buffers beside them) and its grad buffer, live at the
        step (accumulating from initialisation), sum to before the step's own copies and temporaries
        (megatron_memory.py: StepBytes.resident, gradients; phases.peak's optimizer_step moment). Read off the
        memoised rank_states, which no micro-batch or recompute policy changes."""
        ms, _, _, copies, _ = rank_states(spec, setup, pc, stage)
        return int(ms.weights + ms.master - copies + ms.optimizer + ms.comm + ms.gradients)

    def saved_floors(self, spec, setup, pc, stages) -> tuple:
        """The last layer's backward's saved and re-run layers, and the head's saved logits (megatron_memory.
        saved_floors), beside states_floor's states and grad buffer, which those moments hold too."""
        return saved_floors(spec, setup, pc, stages)

    def reduced_grad_bytes(self, setup, st):
        """The main-grad buffer's dtype, which DDP all-reduces, the distributed optimizer and Megatron-FSDP
        reduce-scatter (parallel/megatron.py grad_buffer_bytes, the memory model's gradients too): fp32 under --bf16
        unless --grad-reduce-in-bf16, whatever the 16-bit .grad the layers compute."""
        return grad_buffer_bytes(setup)

    def stepped_grad_bytes(self, setup, st):
        """The fp32 main params step on fp32 grads: the fp32 main-grad buffer's own shard (`.float()` of an fp32
        tensor is itself), or a `.float()` copy of a 16-bit buffer's, one per parameter (read 2, write 4 bytes):
        distrib_optimizer.py:2419 (--zero 1), optimizer.py:759 (--zero 0), Megatron-FSDP's update_main_grads
        `optimizer_grad.to(param.dtype)` on its fp32 main weights (fsdp/src/megatron_fsdp/param_and_grad_buffer.py:
        2646-2649). Without a master (--precision fp32) the update reads the fp32 buffer itself.
        NB: the copy is counted one launch per tensor of the rank's stage, as the update's own passes are (the
        distributed optimizer's shard spans about 1/(dp·cp) of them: over-counts its launches)."""
        buf = grad_buffer_bytes(setup)
        if not st.master or buf == FP32:
            return float(buf), 0.0
        return float(FP32), float(buf + FP32)

    def tensors_per_rank(self, spec: ModelSpec, layers: int, embedding: bool, head: bool) -> int:
        """Megatron-Core's parameter tensors (fused linear_qkv and linear_fc1: parallel/megatron.py)."""
        return megatron_tensors(spec, layers, embedding, head)

    def clipped_params(self, setup: Setup, trained: float) -> float:
        """The distributed optimizer's (--zero 1) main grads: the rank's dp x cp shard (optimizer/
        distrib_optimizer.py:386-399; stacks/megatron.toml [distributed_optimizer]); Megatron-FSDP's (--zero 2/3)
        the same shard of its distributed main grad buffer ([megatron_fsdp])."""
        return trained / shards(setup)

    def clip_work(self, setup, st, clipped, tensors, largest, sizes):
        """multi_tensor_l2norm over the fp32 main grads, multi_tensor_scale above clip_grad (grad_clip.megatron_clip)."""
        return grad_clip.megatron_clip(setup, clipped, tensors, largest)

    def communicators(self, setup: Setup) -> dict[str, int]:
        """parallel_state.py initialize_model_parallel (:548): tensor (:1014), pipeline (:1032), context (:970: ring
        attention), data + context (:825: the gradient reduce-scatter / all-reduce), model (:999, tp x pp: the
        gradient-norm all-reduce), embedding (:1037, pp > 1: first and last stage), and for MoE expert (:2174)
        and expert-data (:1246) groups."""
        groups = dict(tp=setup.tp, pp=setup.pp, cp=setup.cp, dp_cp=setup.dp * setup.cp, model=setup.tp * setup.pp,
                      embedding=2 if setup.pp > 1 else 1)
        if setup.ep > 1:
            groups.update(ep=setup.ep, expert_dp=setup.expert_dp)
        return groups

    def loss_block_bytes(self, setup, logits):
        """The cross-entropy's largest block per --loss-fusion (megatron_loss.largest_block): the fp32 softmax
        of none/native, the 16-bit logits Transformer Engine's fused loss saves and writes its gradient into."""
        from ..megatron_activations import act_bytes
        return largest_block(setup, act_bytes(setup), logits)

    def host_copy_seconds(self, spec, setup, gpu, forward, backward, layers):
        """--offload-layers: the copies Transformer Engine's offload handler leaves exposed (megatron_offload.py),
        each offloaded layer's bytes over the GPU's host link (kernels.toml host_link) one way in the forward and
        back in the backward."""
        if not setup.offload_layers:
            return 0.0
        from ..memory import train_memory
        from ..roofline import kernels_for
        link = kernels_for(gpu).host_link
        if not link:
            raise SetupError(f"--offload-layers: no host link bandwidth is known for {gpu.name} (kernels.toml "
                             "host_link); use a catalog GPU")
        n = min(setup.offload_layers, layers)
        per_layer = (train_memory(spec, setup).offloaded_activations or 0) / n
        return megatron_offload.exposed_seconds(layers, n, per_layer / link, forward / layers, backward / layers)

    def check_model(self, spec: ModelSpec, setup: Setup) -> None:
        """--recompute-modules naming a module the model has nothing for (megatron_recompute.check_model); an
        --offload-layers count Megatron refuses: at least the model's layers (transformer_config.py:1137-1142);
        --overlap-moe-comm beside MTP layers Megatron refuses (stacks/megatron.py moe_overlap_mtp: the model's count
        where --mtp-layers is not given)."""
        megatron_recompute.check_model(spec, setup)
        why = moe_overlap_mtp(setup, mtp_layers(spec, setup))
        if why:
            raise SetupError(why)
        if setup.offload_layers and spec.layers > megatron_offload.MAX_LAYERS:
            raise SetupError(f"--offload-layers: {spec.name} has {spec.layers:,} layers; the offload window is laid "
                             f"out layer by layer (analytic/megatron_offload.py), up to {megatron_offload.MAX_LAYERS:,} "
                             "layers: check the config's layer count, or drop --offload-layers")
        if setup.offload_layers >= spec.layers:
            raise SetupError(f"--offload-layers {setup.offload_layers}: Megatron offloads fewer layers than the "
                             f"model's {spec.layers} (transformer_config.py:1137-1142): use at most {spec.layers - 1}")

    def warnings(self, spec: ModelSpec, setup: Setup, gpu=None) -> list[str]:
        from ..roofline import blackwell
        out = []
        # the check runs below compute capability 10 (arguments.py:927-928 get_device_arch_version() < 10)
        if setup.zero >= 2 and (setup.tp > 1 or setup.cp > 1) and (gpu is None or not blackwell(gpu)):
            out.append("Megatron-LM warns against Megatron-FSDP (--zero 2/3) with tensor or context parallelism on "
                       "Hopper and earlier: sequence parallelism wants CUDA_DEVICE_MAX_CONNECTIONS=1, FSDP more "
                       "(Megatron-LM core_v0.16.1 megatron/training/arguments.py:927-940); modelled as if both overlap")
        if spec.is_moe and setup.tp > 1 and not setup.sequence_parallel:
            out.append("Megatron warns that expert and tensor parallelism need --sequence-parallel "
                       "(model_parallel_config.py:440-445); the MoE layers are modelled as with it")
        return out

    def notes(self, spec: ModelSpec, setup: Setup) -> list[str]:
        return te_recipes.notes(spec, setup)  # --low-precision: Transformer Engine's recipe


MODEL = MegatronModel()
