"""How parallelism divides one rank's memory and what communication it adds to the step, one axis per module (no
torch): pipeline.py (which layers a stage holds, how many micro-batches are in flight; its sends and bubble),
tensor.py (TP/SP shards of parameters and activations; their all-reduces), context.py (ring attention), expert.py
(the all-to-all token dispatch), zero.py (ZeRO/FSDP shards of the model states, their buffers and the data-parallel
collectives), fsdp2.py / deepspeed.py / megatron.py (what those engines hold and copy); collectives.py (the ring model
and the links every axis times its communication with). analytic/step_time.py sums the terms."""
