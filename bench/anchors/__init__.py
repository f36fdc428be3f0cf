"""The tools people use today (accelerate, DeepSpeed, llm-analysis, MemTracker) on trainfit's accuracy cases."""
