"""The GPU-free prediction: the trace of a workload, replayed through the allocator model with the
kernels' own blocks (formulas and a GPU's calibration) and the attention backend PyTorch picks."""
