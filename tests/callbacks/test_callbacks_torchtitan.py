"""torchtitan's pre-flight, the fast default case of the family (the real Trainer on one and two CPU ranks is in
test_callbacks_trainers.py, heavy): its own JobConfig and llama3 model args read without a step."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_torchtitan_preflight_from_its_job_config_and_model_args():
    """torchtitan 0.2.2's own JobConfig and llama3 debugmodel args: the spec trainfit builds has the parameters of
    torchtitan's own Transformer (built on the meta device), and the job's batch, sequence and layout."""
    from types import SimpleNamespace

    pytest.importorskip("torchtitan")
    from torchtitan.config import JobConfig
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import Transformer

    from trainfit.callbacks.torchtitan import checked, preflight

    job = JobConfig()
    job.training.local_batch_size, job.training.seq_len = 4, 256
    args = llama3_args["debugmodel"]
    with torch.device("meta"):
        n = sum(p.numel() for p in Transformer(args).parameters())
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], fused=True)
    trainer = SimpleNamespace(job_config=job, model_args=args, optimizers=SimpleNamespace(optimizers=[opt]),
                              parallel_dims=SimpleNamespace(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1),
                              device=torch.device("cpu"), gradient_accumulation_steps=1)
    pre = preflight(trainer)
    s = pre.estimate.setup
    assert pre.estimate.params == n
    assert (s.stack, s.batch, s.seq, s.precision, s.recompute, s.optimizer_kernel, s.max_grad_norm) == \
        ("torchtitan", 4, 256, "amp-bf16", "layer:2", "fused", 1.0)  # JobConfig's defaults: selective "2", max_norm 1
    job.model.converters = ["quantize.linear.float8"]
    with pytest.raises(Exception, match="converters"):
        preflight(trainer)
    assert checked(SimpleNamespace, steps=1).__name__ == "CheckedSimpleNamespace"
