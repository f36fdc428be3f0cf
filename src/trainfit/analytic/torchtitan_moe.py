"""What torchtitan's MoE block saves for backward (no torch): its own MoE module (torchtitan 0.2.2
models/moe/moe.py), which its deepseek_v3, qwen3 and llama4 models build, on the grouped-GEMM path of SM90+ GPUs.

    router      gate Linear (:325) -> softmax / sigmoid in fp32 (:328-333, saves its fp32 output) -> topk indices
                (:336-341, saved by the gather at :346) -> [route_norm: top / top.sum() (:355-357), the k weights
                and their sum saved] -> * route_scale (a Python float: nothing saved)
    reorder     histc, argsort of the T·k expert ids (:377-383, int64, saved by the index ops that use it) and
                `argsort // top_k` (:439, int64, saved by the gather of the routed input)
    score       score_before_experts (llama4): routed_input.to(fp32) * the sorted scores (:441-445, both saved)
    experts     indices_padding_wrapper (utils.py:73-95): every expert's rows padded up to a multiple of
                TOKEN_GROUP_ALIGN_SIZE_M = 8 (utils.py:12, _permute :41-58: T·k + E·8 rows, int32 indices saved);
                _run_experts_grouped_mm (:113-130): x.bfloat16() called twice (one copy each for w1 and w3 where
                x is not already bf16), w.bfloat16() of each weight (a copy where it is not bf16), silu's input,
                its output, the w3 product and their product, all bf16 (saved by grouped_mm, silu and mul)
    combine     zeros + index_put (:460-465, the argsort indices), then without score_before_experts
                bmm(top_scores, routed_output_unsorted.float()) (:469-476, both saved; autocast casts both to
                its dtype), with it a plain sum (:480)
    shared      FeedForward (:45-68: w2(silu(w1 x) * w3 x)) on the block input
Checked byte for byte against the storages autograd saves in torchtitan's own module, and the step's peak against
its real step on CPU (tests/stacks/test_torchtitan_moe.py, bench/targets/torchtitan_moe_cpu.py).
Under expert parallelism ExpertParallel's all-to-all and its own _permute (distributed/expert_parallel.py) take
indices_padding_wrapper's place: counted as above over the busiest rank's received rows (its dispatch buffers:
parallel/expert_memory.py; the re-run's high points: moments), checked against every rank of a real 2-rank EP step
(bench torchtitan_moe_cpu).
Its kernels, for the step's time: ops/torchtitan_moe.py.
"""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
from .moe_imbalance import busiest_rank_load
from .params import local_experts
from .precision import state_bytes

FP32 = 4
INDEX = 8  # int64
INT32 = 4
BF16 = 2  # _run_experts_grouped_mm computes in bf16 whatever the step's dtype (moe.py:123-128)
ALIGN = 8  # TOKEN_GROUP_ALIGN_SIZE_M, bf16's (models/moe/utils.py:12)


def block_on(setup: Setup) -> bool:
    """Whether the stack's sparse block is torchtitan's MoE module (stacks/*.toml [moe] block)."""
    return setup.stack_facts.facts.get("moe", {}).get("block") == "torchtitan-moe"


def row_bytes(spec: ModelSpec, st, setup: Setup | None = None) -> float:
    """Per padded row of the grouped GEMMs, what is saved: its int32 index, x's bf16 copies (one where x is bf16
    already: .bfloat16() returns it), silu's input and output, the w3 product and their product; gpt_oss's experts
    (gptoss_row_bytes) where the model builds them."""
    if setup is not None and model_fact(spec, setup, "gptoss_experts"):
        return gptoss_row_bytes(spec)
    copies = 1 if st.residual == BF16 else 2
    return INT32 + BF16 * (copies * spec.hidden + 4 * spec.moe.expert_intermediate)


def gptoss_row_bytes(spec: ModelSpec) -> float:
    """Per padded row, what torchtitan's gpt_oss experts save (models/gpt_oss/model/moe.py:142-176, all bf16: its
    blocks are bf16, model.py:339-342): the int32 index (_permute), x's one bf16 copy (grouped_mm, :155-157),
    mlp1's output plus its bias (2·I wide: the clamps save their inputs, views of it, :87-90), the clamped gate,
    sigmoid's output, the gated product and the linear half plus 1 (the products', :91-93), the SwiGLU output
    (mlp2's grouped_mm, :166), and the two int64 row indices repeat_interleave's index_select saves for the biases
    (:159, :169). NB: those indices are over the experts' aligned rows (Σ round_up(max(n_e, 8), 8)), counted here
    over all padded rows (high by at most 8 local experts' worth of rows, 16 bytes a row)."""
    i = spec.moe.expert_intermediate
    return INT32 + 2 * INDEX + BF16 * (spec.hidden + 2 * i + 5 * i)


def flex_sinks_saved(spec: ModelSpec, a: int) -> float:
    """Per token, what torchtitan's gpt_oss attention saves beyond the fused kernels' q, k, v, output and fp32
    logsumexp (activations._flash_saved; torch 2.13 _higher_order_ops/flex_attention.py:796-812): the sink rescale's
    fp32 σ(lse − sinks) (sigmoid's output) and its cast to the output's dtype (the multiply's, models/gpt_oss/model/
    model.py:253-254), and the rescaled output's contiguous (b, s, h, d) copy that wo saves (:256-262: the
    multiply's output follows flex's (b, h, s, d) layout). The rotary saves only its cos and sin (the multiplies
    by them need no q or k: :152-153; activations.cos_sin_bytes)."""
    return a * spec.q_dim + (FP32 + a) * spec.heads


def model_fact(spec: ModelSpec, setup: Setup, name: str) -> bool:
    """stacks/torchtitan.toml [moe_models] `name` for the torchtitan model that builds spec's family: its MoEArgs'
    score_before_experts (the routed input scaled by its score before the experts), rotary_cos_sin (its rotary an
    fp32 cos/sin cache)."""
    return setup.stack_facts.moe_model(spec.family) in setup.stack_facts.facts.get("moe_models", {}).get(name, ())


def autocast(setup: Setup, act: int) -> bool:
    """torchtitan's maybe_enable_amp (distributed/utils.py:243-263): torch.autocast in the 16-bit dtype unless FSDP
    is on (fsdp_enabled: dp_shard·cp > 1), over bf16 weights too, where it casts only fp32 tensors (the router's)."""
    return act != FP32 and not (setup.zero >= 2 and setup.dp * setup.cp > 1)


def moe_block(spec: ModelSpec, setup: Setup) -> tuple[dict, float]:
    """({"linear_inputs": bytes per token, "mlp": bytes per token}, fixed bytes) one torchtitan MoE block saves
    (module docstring), as analytic/moe.py's moe_block returns them."""
    m = spec.moe
    st = state_bytes(setup)
    a, amp = st.act, st.autocast
    h, k = spec.hidden, m.top_k
    # the block input x is the ffn norm's output, in the residual dtype; the gate linear saves it (autocast: its
    # own cast)
    inputs = a * h
    router = FP32 * m.num_experts + INDEX * k  # fp32 scores, topk indices
    if m.norm_topk:
        router += FP32 * k + FP32
    reorder = 2 * INDEX * k
    if model_fact(spec, setup, "score_before_experts"):
        score = FP32 * k * h + FP32 * k  # routed_input.to(fp32) and the sorted scores
        combine = 0.0
    else:
        score = 0.0
        w = a if autocast(setup, a) else FP32  # autocast runs bmm in its dtype and casts both fp32 operands
        combine = w * k * h + w * k
    experts = k * row_bytes(spec, st, setup)  # each routed copy's row of the grouped GEMMs
    # the busiest rank's experts run on its received copies; the router's, the reorder's and the scores' tensors are
    # the source rank's own T·k (made before ExpertParallel's dispatch, moe.py:500-521)
    load = busiest_rank_load(spec, setup, setup.batch * setup.seq / setup.cp)
    mlp = router + combine + reorder + score + experts * load
    fixed = uncached_fixed(spec, setup)
    if amp:
        fixed += a * m.num_experts * h  # autocast's cast of the gate weight
    if m.shared_intermediate:
        cast_inputs, intermediates = shared_saved(spec, st)
        inputs += cast_inputs
        mlp += intermediates
        if amp:
            fixed += a * 3 * h * m.shared_intermediate
    return {"linear_inputs": inputs, "mlp": mlp}, fixed


def shared_saved(spec: ModelSpec, st) -> tuple[float, float]:
    """Per token, what the shared experts' FeedForward saves: (under autocast w1's and w3's casts of the input, 0
    otherwise; silu's input and output, the w3 product and their product)."""
    a = st.act
    return (2 * a * spec.hidden if st.autocast else 0.0), 4 * a * spec.moe.shared_intermediate


def uncached_fixed(spec: ModelSpec, setup: Setup) -> float:
    """Of the block's batch-independent saved bytes, those autocast's cache does not hold: the padding's rows (8 per
    local expert) on the grouped GEMMs' saved tensors, the int32 group offsets, and the bf16 copy of each expert
    matrix over non-bf16 weights (`w.bfloat16()`, moe.py:123-128: a plain copy, saved by grouped_mm)."""
    st, local = state_bytes(setup), local_experts(spec, setup)
    out = local * ALIGN * row_bytes(spec, st, setup) + INT32 * local
    if (st.param or st.weight) != BF16:
        out += BF16 * 3 * local * spec.hidden * spec.moe.expert_intermediate
    return out


def padded_rows(spec: ModelSpec, setup: Setup, routed: float) -> float:
    """Rows of the experts' padded input (pad_rows) for `routed` rows over the rank's experts."""
    return pad_rows(routed, local_experts(spec, setup))


def pad_rows(routed: float, local: int) -> float:
    """_permute's max_len: round_up(routed + 8·local, 8) rows (models/moe/utils.py:41-45), whatever the tokens per
    expert (the unused rows index the appended zero row)."""
    return -(-(routed + local * ALIGN) // ALIGN) * ALIGN


def rerun_grad_cast(spec: ModelSpec, setup: Setup, st, tokens: float) -> float:
    """The layer output's gradients made before the re-run starts, in other dtypes than x's (the nodes before the
    combine's bmm backward need no saved tensor; the bmm's, which does, starts the re-run; autograd's engine casts
    each gradient to its input's dtype, engine.cpp validate_outputs): the cast to the bmm's dtype (`.to(x.dtype)`
    of moe.py:547) where the bmm runs in fp32 beside a 16-bit x (no autocast: FSDP on, torchtitan's
    maybe_enable_amp; none where the scored block sums in x's, llama4), and the shared experts' output's (moe.py:555
    `out + out_experts`) where it is 16-bit beside x's fp32 (autocast over fp32 weights)."""
    a, r, h = st.act, st.residual, spec.hidden
    w = a if autocast(setup, a) else FP32
    bmm = w * h * tokens if w != r and not model_fact(spec, setup, "score_before_experts") else 0.0
    shared = a * h * tokens if spec.moe.shared_intermediate and a != r else 0.0
    return bmm + shared


def moments(spec: ModelSpec, setup: Setup, st, tokens: float, pending: float, recomputed: float,
            mid: float) -> list:
    """The MoE block's backward high points (backward.Moment), read off the real CPU step's allocation records
    (measure engine, tiny qwen3 and deepseek_v3: the peak's allocation and its op stack):
    (a) with recomputation, inside the re-run forward (started by the combine's BmmBackward0, its first node) at
        _unpermute (models/moe/utils.py:62-66): the experts' output cast back to x's dtype (`.type_as(x)`, P rows),
        the unpadded output (T·k + 1 rows, new_empty) and index_put's int64 copy of the int32 indices; beside them
        the forward frames' locals no op saved: the padded input (P rows, held by indices_padding_wrapper; saved
        already where it is bf16, grouped_mm's `x.bfloat16()` being x), the routed input (T·k rows, MoE.forward),
        the scaled and the sorted top-k scores, and under autocast the block input (the gate saves its cast); and
        the saved set made again so far (all but the combine's bmm operands) and the gradients made before the
        re-run: the layer output's (`pending`) and its cast to the bmm's dtype (the `.to(x.dtype)` of moe.py:547);
    (b) the combine's bmm backward: the gradients of its two operands beside the whole saved set;
    (c) with recomputation, at the re-run's last ops of MoE.forward (0.2.2 moe.py:547, the cast of the weighted
        sum to x's dtype, and :555, the shared experts' output plus the routed): the whole saved set and the frame's
        locals: the routed input, the unpadded and the unsorted outputs (T·k rows each), the scores, the weighted
        sum in x's dtype, the shared experts' output, and the larger of the bmm's output before its cast and the
        sum (on a CPU with the add's fp32 copy of a 16-bit shared output).
    Under expert parallelism ExpertParallel's dispatch and combine (distributed/expert_parallel.py:102-181) wrap the
    experts: the rank's own T·k routed copies (`sent`) go out by all-to-all, the copies its experts receive
    (`received`, the busiest rank's load) are padded by the same _permute, and the combine's _unpermute is followed
    by the all-to-all back, whose output (`sent` rows, new_empty in all_to_all_single_autograd) is the re-run's high
    point (a) in place of index_put's int64 copy (freed by then), and is the routed output at (c) (in place of the
    unpadded one, which the collective holds until the unsort waits on its output: with shared experts, run between,
    a high point (d) of its own); read off a real 2-rank EP step on CPU (torchrun, gloo). The shared experts run after
    the routed ones (moe.py:525-528), so at (a) their saved set is not made again yet.
    `mid`: the block's mid residual where no op saves it (held by the block's frame through the MoE)."""
    from .backward import Moment  # noqa: PLC0415 (backward imports this module's peers)

    m = spec.moe
    a, r, h, k = st.act, st.residual, spec.hidden, m.top_k
    ep = getattr(setup, "ep", 1) > 1
    sent = k * tokens
    received = sent * busiest_rank_load(spec, setup, tokens)
    rows = padded_rows(spec, setup, received)
    w = a if autocast(setup, a) else FP32
    scored = model_fact(spec, setup, "score_before_experts")
    grad_cast = rerun_grad_cast(spec, setup, st, tokens)
    combine = 0.0 if scored else (w * h + w) * k * tokens  # the bmm's saved operands
    out = [Moment(recomputed + pending + grad_cast + combine, 0.0)]
    if setup.recompute not in ("full", "op"):
        return out
    block_in = r * h * tokens if r != a and autocast(setup, a) else 0  # the gate saves its cast
    # the routed input (or, scored, its scaled copy: the gather itself is saved by the multiply) and the scores
    # no op saved (scored: the scaled top-k; else those and their sorted copy)
    routed_in = sent * h * r + (1 if scored else 2) * FP32 * sent
    unpermute = rows * h * r + (received + 1) * h * r + (sent * h * r if ep else INDEX * rows)
    # the shared experts run after the routed ones (moe.py:525-528): their saved set is not made again yet
    s = m.shared_intermediate
    shared = sum(shared_saved(spec, st)) * tokens if s else 0.0
    # the padded input: in the saved set already where it is bf16 (grouped_mm saves x.bfloat16(), x itself)
    padded_in = rows * h * r if r != BF16 else 0.0
    out.append(Moment(recomputed - combine - shared + pending + grad_cast + mid + unpermute + padded_in
                      + routed_in + block_in, 0.0))
    if ep and s:
        # (d) at the unsort's zeros (moe.py:531-535), after the shared experts: the all-to-all's input (the unpadded
        # buffer) is still held by the collective until the unsort's index_put waits on its output, beside that
        # output, the shared experts' output (no op saves it) and the zeros
        out.append(Moment(recomputed - combine + pending + grad_cast + mid + block_in + routed_in
                          + (received + 1 + 2 * sent) * h * r + a * h * tokens, 0.0))
    # (the unsorted output is the bmm's saved operand itself where `.float()` is a no-op, moe.py:546)
    unsorted = 0 if (w == r == FP32 and not scored) else sent * h * r
    routed_out = sent if ep else received + 1  # the all-to-all's output, or the unpadded buffer
    frame = block_in + routed_in + routed_out * h * r + unsorted + r * h * tokens
    # the bmm's output beside its cast to x's dtype (moe.py:547), where the bmm runs in another dtype than x's
    at_cast = w * h * tokens if w != r and not scored else 0
    if m.shared_intermediate:
        # the shared experts' output (made before the combine, moe.py:529), then the larger of the cast's op
        # and the sum's (moe.py:555): the sum in x's dtype; a CPU add of the 16-bit shared output to the fp32 sum
        # first copies it to fp32 (TensorIterator's common-dtype cast on CPU, trace/cpu_casts.py)
        at_sum = r * h * tokens + (FP32 * h * tokens if a != r and setup.device == "cpu" else 0)
        frame += a * h * tokens + max(at_sum, at_cast)
    else:
        frame += at_cast
    out.append(Moment(recomputed + pending + grad_cast + mid + frame, 0.0))
    return out
