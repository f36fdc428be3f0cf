"""The CUDA harness: real steps and kernels on a GPU (cuda_truth, cuda_kernels, cuda_context), and the replays and
fitters that read their committed runs without one."""
