"""The mechanism without the lab: torch.tensor(data) under torch.device("cuda") inside a
FakeTensorMode. PyTorch's C++ (internal_new_from_data) builds the tensor with the Python
dispatch key excluded and copies it to the GPU before lift_fresh hands it to the fake mode:
a real block, held as long as the fake tensor lives.

    python3 raw.py"""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

before = torch.cuda.memory_allocated()
with FakeTensorMode(), torch.device("cuda"):
    counter = torch.nn.BatchNorm1d(64).num_batches_tracked
    data = torch.tensor([1.0] * 1000)
    empty = torch.tensor([])
print("fake:", type(counter).__name__, type(data).__name__)
print("real bytes allocated on the GPU while they live:", torch.cuda.memory_allocated() - before)
del counter, data, empty
print("after they go:", torch.cuda.memory_allocated() - before)
