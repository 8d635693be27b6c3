"""How a model's parameters reach the device, as PyTorch moves them on a GPU.

A workload may build its model on the CPU and move it (`model.to(device, dtype)`, `.cuda()`,
`.half()`), build it under `torch.device(...)`, or build it on the meta device and give it
memory with `to_empty`. While tracing, two things must hold that PyTorch alone does not give:

1. **Nothing the trace builds holds real memory.** The trace runs a CPU call for real when
   every tensor argument is a real CPU tensor (a data loader's lengths, a schedule read back
   with `.tolist()`): a model built on the CPU would then fill every parameter for real (a
   1B-parameter model, gigabytes of host memory and seconds of random initialisation). A
   parameter is a module's state, never a value the step reads back: `nn.Parameter` made
   from a real CPU tensor takes a fake one of the same shape, strides and dtype instead
   (`fake_parameters`), so that its initialisation, and the whole model, cost no memory.

2. **One tensor shared by several modules stays one.** `nn.Module._apply` (torch/nn/modules/
   module.py) converts each module's parameters in turn. When the old and new tensors have
   compatible types (`TensorImpl::has_compatible_shallow_copy_type`: dense CPU and CUDA
   tensors are, the meta device's are not), it changes the Parameter in place
   (`param.data = new`), so a weight tied between an embedding and an output layer is
   converted once: the second module finds it on the device already, and `.to` returns it.
   Otherwise it gives the module a new Parameter and leaves the old one where it was: after
   `to_empty` from the meta device each module holds a tensor of its own, and a tie is
   broken (which is why transformers ties the weights again after it). For fake tensors
   `_apply` always swaps the contents in place (`swap_tensors`), which keeps a tie that a GPU
   keeps, and keeps one a GPU breaks; `_apply` here undoes the swap where the real devices'
   types are not compatible (`new_parameter`).

   A trace without a GPU stands the meta device in for the GPU: a model built on `meta` by
   the workload itself cannot be told from one built on the device. Such a trace counts the
   model as held from its build (the GPU holds nothing until `to_empty`), and keeps a tie
   that the GPU breaks: every `to_empty` there is noted (TO_EMPTY), and the prediction is
   approximate. Beside a GPU the trace runs on the GPU's own fake device and tells them
   apart.

Standard library only (torch is passed in).
"""

from __future__ import annotations

from pipeline.core import torch_private

TO_EMPTY = "to_empty (from the meta device, without a GPU)"
TO_EMPTY_WHY = (
    "a trace without a GPU stands the meta device in for the GPU, so a model built on the "
    "meta device is counted as held before to_empty gives it memory, and a shared parameter, "
    "which to_empty breaks into copies on a GPU, is kept one"
)


def new_parameter(old, new, target) -> bool:
    """Whether a GPU run's `_apply` gives the module a new Parameter for `old` converted to
    `new`: their tensor types are not compatible, which among the devices a workload uses
    means that one is on the meta device and the other is not. Without a GPU (target meta)
    the meta device is the GPU's stand-in: a conversion between the two is an in-place one."""
    if target.type == "meta":
        return False
    return (old.device.type == "meta") != (new.device.type == "meta")


def install(torch, tracer):
    """Patches Parameter and Module for the trace; returns the function that undoes it."""
    Parameter = torch.nn.Parameter
    Module = torch.nn.Module
    FakeTensor = torch_private.FakeTensor
    target = torch.device(tracer.trace.device)
    original_new = Parameter.__new__
    saved_new = Parameter.__dict__["__new__"]  # a staticmethod, restored as it was
    original_apply = Module._apply
    original_to_empty = Module.to_empty

    def fake_parameters(cls, data=None, requires_grad=True):
        if (
            isinstance(data, torch.Tensor)
            and not isinstance(data, FakeTensor)
            and data.device.type == "cpu"
            and data.layout == torch.strided
        ):
            with torch_private.unset_fake_temporarily():
                data = tracer.fake.from_tensor(data)
            torch_private.forget_converted_tensors(tracer.fake)
        return original_new(cls, data, requires_grad)

    def _apply(module, fn, recurse=True):
        if recurse:
            for child in module.children():
                child._apply(fn)
        renewed: dict = {}  # id of a Parameter -> its shape, strides, dtype, device before

        def converted(tensor):
            out = fn(tensor)
            if isinstance(tensor, Parameter) and new_parameter(tensor, out, target):
                renewed[id(tensor)] = (tensor.shape, tensor.stride(), tensor.dtype, tensor.device)
            return out

        before = list(module._parameters.items())
        original_apply(module, converted, recurse=False)
        for key, param in before:
            if param is None or id(param) not in renewed or module._parameters[key] is not param:
                continue
            shape, stride, dtype, device = renewed[id(param)]
            module._parameters[key] = Parameter(param.detach(), param.requires_grad)
            with torch.no_grad():
                old = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            torch.utils.swap_tensors(param, Parameter(old, param.requires_grad))
        return module

    def to_empty(module, *, device, recurse=True):
        if target.type == "meta" and torch.device(device).type == "meta":
            tracer.trace.notes.setdefault(TO_EMPTY, TO_EMPTY_WHY)
        return original_to_empty(module, device=device, recurse=recurse)

    Parameter.__new__ = fake_parameters
    Module._apply = _apply
    Module.to_empty = to_empty

    def undo() -> None:
        Parameter.__new__ = saved_new
        Module._apply = original_apply
        Module.to_empty = original_to_empty

    return undo
