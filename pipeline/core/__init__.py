"""The floor every other imports: the allocator model, the phase protocol, environment capture,
writers and command lines, the private PyTorch APIs, the workload contract and its registry."""
