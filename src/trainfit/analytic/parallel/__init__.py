"""How parallelism divides one rank's memory, one axis per module (no torch):
pipeline.py (which layers a stage holds and how many micro-batches are in flight), tensor.py (TP/SP shards of
parameters and activations), zero.py (ZeRO/FSDP shards of the model states and their communication buffers)."""
