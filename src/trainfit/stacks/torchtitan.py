"""torchtitan's rules that are code, not facts (stacks/torchtitan.toml holds the facts): its expert-parallel layout.
`setup` is read by attribute: this layer does not import trainfit.setup."""
from __future__ import annotations


def refuse(setup) -> str | None:
    """torchtitan's expert layout (torchtitan 0.2.2 distributed/parallel_dims.py): --etp is 1 or --tp (:58-59), has
    no effect without --ep (config/job_config.py:466), and the ep × etp ranks tile the dp_shard × cp × tp ranks of a
    stage (:138, efsdp = dp_shard·cp·tp // (etp·ep) must be whole); trainfit models EP under FSDP (the experts'
    own efsdp group, stacks/torchtitan.toml [expert_parallel]). Else None."""
    if setup.ep == 1:
        if setup.etp not in (None, 1):
            return (f"--etp {setup.etp}: torchtitan's expert_tensor_parallel_degree has no effect without expert "
                    "parallelism (config/job_config.py:466); add --ep N or drop --etp")
        return None
    etp = setup.expert_tp
    if etp not in (1, setup.tp):
        return (f"--etp {etp}: torchtitan runs expert tensor parallelism of 1 or --tp ({setup.tp}) only "
                f"(distributed/parallel_dims.py:58-59); use --etp 1 or --etp {setup.tp}")
    if setup.dp > 1 and setup.zero < 2:
        return (f"--ep {setup.ep} with --zero {setup.zero}: torchtitan shards the experts with FSDP over their own "
                "efsdp group whenever ep > 1 (models/deepseek_v3/infra/parallelize.py:162-188); use --zero 3 "
                "(or 2), as trainfit models it")
    shard = setup.dp if setup.zero >= 2 else 1
    ranks = shard * setup.cp * setup.tp
    if ranks % (setup.ep * etp):
        return (f"--ep {setup.ep} × --etp {etp} must divide the dp_shard × tp = {ranks} ranks of a pipeline stage "
                "(torchtitan distributed/parallel_dims.py:138: efsdp = dp_shard·cp·tp // (etp·ep))")
    return None
