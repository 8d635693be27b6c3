"""The GPU-free prediction of a workload's allocator counters: its trace on fake tensors,
replayed through the allocator model (trace_prediction.py says how, and gives every name
here under one). Its modules, each importing only those before it: model, operators,
calibration, gpu_paths, recorder, tracer, replay, bounds, prediction."""
