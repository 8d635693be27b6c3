"""The tracer: a workload run phase by phase on fake tensors (`Tracer`, `run_trace`) under
the recorder, with the function mode that takes the ways a GPU run takes where a meta trace
would not (`make_choice_notes`), and the emulations of pipeline/predicting/ (autocast, fused
kernels, optimizers, loaders, bitsandbytes) installed for the trace and undone after it.

Standard library at module level: torch is passed in."""

from __future__ import annotations

import importlib.util
import sys

from pipeline.core import phase_protocol, torch_private
from pipeline.predicting import (
    autocast_policy,
    bnb_int8,
    bnb_kernels,
    bnb_optimizers,
    ctc_loss,
    cudnn_rnn,
    fast_paths,
    from_pretrained,
    fused_cells,
    fused_dropout,
    grad_scaler,
    late_imports,
    loss_outputs,
    module_conversion,
    packed_positions,
    quantized_load,
    reduce_scratch,
)
from pipeline.predicting.trace.gpu_paths import (
    BATCH_NORM_PARAMETERS,
    DROPOUT_PARAMETERS,
    F_BATCH_NORM_PARAMETERS,
    batch_norm_as_on_gpu,
    cross_entropy_selects,
    dropout_as_on_gpu,
    masked_fill_selects,
    sdpa_as_on_gpu,
    with_mode_inside,
)
from pipeline.predicting.trace.model import Trace, TraceStopped
from pipeline.predicting.trace.operators import META_CHOICES, OTHER_WAY
from pipeline.predicting.trace.recorder import make_recorder


def build_of(torch) -> str:
    return "cuda" if torch.version.cuda or torch.version.hip else "cpu-only"


def trace_device(torch, index: int) -> str:
    """Where a GPU is visible, the trace runs on fake `cuda:N` tensors, so that PyTorch makes
    that GPU's kernel choices; elsewhere on meta (autograd cannot run on fake CUDA tensors
    without a GPU: PyTorch aborts the process)."""
    return f"cuda:{index}" if torch.cuda.is_available() else "meta"


class Tracer:
    """`with Tracer(torch, device) as tracer:` runs code on fake tensors and records it;
    `tracer.phase` has `phase_protocol.run_phase`'s shape, so one phase driver serves both."""

    def __init__(self, torch, device: str, fake: bool = True, target=None) -> None:
        self.torch = torch
        self.target = target  # attention_choice.TargetGpu: the GPU a meta trace stands for
        self.real = not fake  # tests record a real run on the CPU the same way
        self.trace = Trace(
            device=device,
            build=build_of(torch),
            torch_version=torch.__version__,
        )
        warning = torch_private.check_version(torch)
        if warning is not None:  # the private APIs below may not do what they were read to do
            self.trace.notes[torch_private.VERSION_NOTE] = warning
        self._undo: list = []

    def __enter__(self) -> Tracer:
        self.fake = torch_private.FakeTensorMode(
            allow_non_fake_inputs=False, allow_fallback_kernels=False
        )
        # Its dispatch cache gives each repeated operator call (one per layer) its outputs'
        # shapes without running the meta kernel again: a quarter of the 8B-class trace's
        # time; the outputs are new fake tensors all the same, so the trace is unchanged.
        self.fake.cache_enabled = True
        self.recorder = make_recorder(self.torch)(self)
        modes = [self.recorder]
        if not self.real:
            modes.insert(0, self.fake)
        if self.trace.device == "meta":
            modes.append(make_choice_notes(self.torch, self.trace, self.target)())
        elif self.target is not None and not self.real:  # beside a measurement: the same calls
            modes.append(make_choice_notes(self.torch, self.trace, self.target, meta=False)())
        try:
            if not self.real:
                self._patch_optimizers()
                self._patch_swap()
                self._patch_deepcopy()
                self._patch_fast_paths()
                if self.trace.device == "meta":  # CUDA autocast's casts, as a GPU makes them
                    self._undo.append(autocast_policy.install(self.torch, self.trace.notes))
                    self._undo.append(bnb_optimizers.install(self.torch, self.trace.notes))
                    if self.target is not None:
                        self._undo.append(fused_dropout.install(self.torch))
                self._undo.append(
                    grad_scaler.install(self.torch, self.trace.notes, self.trace.device == "meta")
                )
                self._undo.append(torch_private.quicker_cache_keys(self.torch))
                self._undo.append(fused_cells.add_fake_kernels(self.torch))
                self._undo.append(module_conversion.install(self.torch, self))
                self._undo.append(
                    from_pretrained.install(
                        self.torch, self.recorder, self.trace.notes, self.trace.device == "meta"
                    )
                )
                if "bitsandbytes.nn.modules" in sys.modules:
                    self._install_bitsandbytes()
                elif importlib.util.find_spec("bitsandbytes") is not None:
                    # imported by transformers inside the trace (a BitsAndBytesConfig)
                    self._undo.append(
                        late_imports.after_import("bitsandbytes", self._install_bitsandbytes)
                    )
                self._undo.append(packed_positions.install(self.torch))
                self._undo.append(loss_outputs.add_fake_kernels(self.torch, self.fake))
                if self.target is not None and self.target.cudnn() is not None:
                    self._undo.append(cudnn_rnn.add_fake_kernels(self.torch))
                    self._patch_rnn_flatten()
            for mode in modes:
                mode.__enter__()
                self._undo.append(lambda mode=mode: mode.__exit__(None, None, None))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _install_bitsandbytes(self) -> None:
        """bitsandbytes' load and kernels as a GPU runs them (quantized_load, bnb_kernels,
        bnb_int8), for the rest of the trace."""
        on_meta = self.trace.device == "meta"
        self._undo.append(
            quantized_load.install(self.torch, self.recorder, self.trace.notes, on_meta)
        )
        self._undo.append(bnb_kernels.install(self.torch, self._gpu_props()))
        self._undo.append(bnb_int8.install(self.torch, self.recorder, self.trace.notes))

    def __exit__(self, *exc) -> None:
        """Modes left and torch's functions restored, in reverse order, whatever happened."""
        while self._undo:
            self._undo.pop()()

    def phase(self, name: str, operation, repetition: int | None = None, passes: int = 1):
        row = phase_protocol.phase_row(name, repetition, passes)
        self.recorder.poll()
        self.trace.events.append(("start", name, repetition, passes))
        result = operation()
        self.recorder.poll()  # what died inside the operation, before the end values
        self.trace.events.append(("end",))
        return row, result

    def _gpu_props(self) -> tuple[int, int, int] | None:
        """(SM count, major, minor) of the GPU the trace is for: the target's without a GPU
        (reduce_scratch.DEVICES), this GPU's beside a measurement; None where unknown."""
        if self.trace.device != "meta":
            index = self.torch.device(self.trace.device).index or 0
            props = self.torch.cuda.get_device_properties(index)
            return props.multi_processor_count, props.major, props.minor
        device = reduce_scratch.DEVICES.get(self.target.name) if self.target else None
        if device is None or not self.target.capability:
            return None
        return (device.multiprocessors, *self.target.capability)

    def _patch_optimizers(self) -> None:
        """torch.optim picks its foreach kernels for plain tensors on a GPU only: let fake
        parameters on the traced device get the same choice as the real ones will."""
        self._undo.append(torch_private.add_foreach_type(torch_private.FakeTensor))
        if self.trace.device == "meta":
            self._undo.append(torch_private.add_optimizer_device("meta"))

    def _patch_swap(self) -> None:
        """nn.Module.to() swaps fake parameters (torch.utils.swap_tensors) where it assigns
        `.data` of real ones, which frees the old storage at once; the swapped-out storage
        would live one parameter longer. Record its free where the real one happens."""
        torch = self.torch
        original = torch.utils.swap_tensors
        recorder = self.recorder

        def swap(t1, t2):
            original(t1, t2)
            recorder.free_if_only_held_by(t2)

        torch.utils.swap_tensors = swap
        self._undo.append(lambda: setattr(torch.utils, "swap_tensors", original))

    def _patch_deepcopy(self) -> None:
        """copy.deepcopy of a fake tensor deep-copies its `__dict__` (torch's
        Tensor.__deepcopy__), and with it the FakeTensorMode it refers to: the copy belongs to
        a second mode, and the next operator mixing it with the others fails ("Mixing fake
        modes NYI"). nn.TransformerEncoder and Decoder deep-copy their layer. A mode is the
        trace's context, not data: a copy of it is itself."""
        FakeTensorMode = torch_private.FakeTensorMode

        had = "__deepcopy__" in FakeTensorMode.__dict__
        original = FakeTensorMode.__dict__.get("__deepcopy__")
        FakeTensorMode.__deepcopy__ = lambda mode, memo: mode

        def undo():
            if had:
                FakeTensorMode.__deepcopy__ = original
            else:
                del FakeTensorMode.__deepcopy__

        self._undo.append(undo)

    def _patch_rnn_flatten(self) -> None:
        """nn.RNNBase.flatten_parameters on fake tensors does what it does on a GPU
        (cudnn_rnn.flatten_on_fake); on real tensors, its own code."""
        torch = self.torch
        rnn_base = torch.nn.RNNBase
        original = rnn_base.flatten_parameters
        fake = torch_private.FakeTensor

        def flatten_parameters(module):
            weights = module._flat_weights
            if not weights or not all(isinstance(w, fake) for w in weights):
                return original(module)
            return cudnn_rnn.flatten_on_fake(torch, module)

        rnn_base.flatten_parameters = flatten_parameters
        self._undo.append(lambda: setattr(rnn_base, "flatten_parameters", original))

    def _patch_fast_paths(self) -> None:
        """nn.MultiheadAttention and TransformerEncoderLayer take PyTorch's fused kernels in
        inference only when no tensor argument has a torch function, which fake tensors
        always have: the trace takes them where a GPU does (fast_paths.py)."""
        self._undo.append(fast_paths.install(self.torch, self.trace.notes))


def make_choice_notes(torch, trace: Trace, target=None, meta: bool = True):
    """On the meta device: note the calls whose kernels a GPU would choose otherwise, and
    make tensors from data fake.

    With a target GPU (attention_choice.TargetGpu), scaled_dot_product_attention takes the
    kernel that GPU takes (`sdpa_as_on_gpu`) and needs no note, unless the rule cannot tell.

    torch.tensor, as_tensor and asarray build a tensor from Python data with PyTorch's
    dispatch keys excluded, and for the meta device return it before handing it to the
    fake mode (`internal_new_from_data` in torch/csrc/utils/tensor_new.cpp): a real meta
    tensor, which the next operator refuses ("Please convert all Tensors to FakeTensors
    first"). Transformers' caches start that way (`torch.tensor([], device=...)`). Built on
    the CPU and copied to the device instead, it is fake, and allocated on the device as a
    GPU run allocates it. For a CUDA device the same C++ copies the data to the GPU before
    the fake mode sees it: the trace beside a measurement would allocate a real block there,
    which a module or a cache can keep into the measurement (BatchNorm's
    `num_batches_tracked`, built under `torch.device("cuda")`, held 512 B before model_load).
    It is built the same way: on the CPU, then copied as a fake tensor.

    On a GPU's fake tensors (`meta=False`, the trace beside a measurement), only
    scaled_dot_product_attention goes through the target's rule, so that the trace makes the
    same calls as the estimate made without a GPU; the rest is the GPU's own."""
    from torch.overrides import TorchFunctionMode

    read = {**choice_tables(torch), "torch": torch, "trace": trace, "target": target, "meta": meta}
    read["held"] = {}  # what a GPU process keeps to its end (cuDNN's dropout state)
    # as class attributes, each read as it is (a function or a slot is not made a method)
    read = {name: staticmethod(value) for name, value in read.items()}
    return type("ChoiceNotes", (ChoiceNotes, TorchFunctionMode), read)


def choice_tables(torch) -> dict:
    """The functions `ChoiceNotes` looks at, by what it does with them."""
    recurrent = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)
    cells = (torch.lstm_cell, torch.gru_cell)
    functions = {
        torch.nn.functional.scaled_dot_product_attention: "scaled_dot_product_attention",
        torch.nn.functional.batch_norm: "batch_norm",
        torch.batch_norm: "batch_norm",
        **dict.fromkeys(recurrent, "recurrent layers"),
        # ATen's LSTMCell and GRUCell take the fused kernel for a CUDA input (RNN.cpp);
        # rnn_tanh_cell and rnn_relu_cell run the same operators on every device.
        **dict.fromkeys((torch.lstm_cell, torch.gru_cell), "recurrent cells"),
    }
    from_data = {torch.tensor, torch.as_tensor, torch.asarray}

    sdpa = torch.nn.functional.scaled_dot_product_attention
    dropouts = {
        torch.nn.functional.dropout: DROPOUT_PARAMETERS,
        torch.dropout: ("input", "p", "train"),
    }
    batch_norms = {
        torch.nn.functional.batch_norm: F_BATCH_NORM_PARAMETERS,
        torch.batch_norm: BATCH_NORM_PARAMETERS,
    }
    # The CTC loss, its blocks sized by the lengths' values: as a GPU runs it (ctc_loss.py).
    ctc = {torch.nn.functional.ctc_loss, torch.ctc_loss}
    # Calls whose C++ takes another way under a dispatch mode (isTensorSubclassLike) than in
    # a real run, which selects elements by a mask's values (`masked_select`): noted.
    other_ways = {
        torch.Tensor.masked_fill: masked_fill_selects,
        torch.Tensor.masked_fill_: masked_fill_selects,
        torch.masked_fill: masked_fill_selects,
        torch.nn.functional.cross_entropy: cross_entropy_selects,
    }
    # `x[index] = number`: for a CUDA tensor PyTorch makes the number a CPU scalar and fills
    # (valueToTensor, python_variable_indexing.cpp); for a meta one, a block on the device.
    setitem = torch.Tensor.__setitem__
    # Every function ChoiceNotes' branches look at: any other runs as it comes, at once.
    special = {sdpa, setitem, torch.Tensor.backward, *functions, *from_data, *recurrent,
               *dropouts, *batch_norms, *ctc, *other_ways}  # fmt: skip
    # Python functions that hand themselves to the modes first (handle_torch_function) and
    # call functions of `special`: run, a mode's handler calls them with the mode off, so
    # that what they call would not be seen (nn.MultiheadAttention's general path and its
    # scaled_dot_product_attention: the meta device's math kernel, where a GPU takes flash).
    # The backward too: non-reentrant checkpointing (torch.utils.checkpoint, transformers'
    # gradient_checkpointing_enable) runs the layer's forward again inside it, from the
    # saved-tensor hooks, and must make the calls the first forward made, or it counts
    # other saved tensors and raises CheckpointError.
    nested = {torch.nn.functional.multi_head_attention_forward, torch.autograd.backward,
              torch.autograd.grad}  # fmt: skip
    # Python functions that check a tensor's values and raise where they are bad, which fake
    # tensors cannot tell: the check's operators run, and it is taken as passed, as it is in
    # any run that goes on (gaussian_nll_loss: `torch.any(var < 0)`; Recorder answers it).
    checked = {torch.nn.functional.gaussian_nll_loss}
    return {
        "batch_norms": batch_norms,
        "cells": cells,
        "checked": checked,
        "ctc": ctc,
        "dropouts": dropouts,
        "from_data": from_data,
        "functions": functions,
        "nested": nested,
        "other_ways": other_ways,
        "recurrent": recurrent,
        "sdpa": sdpa,
        "setitem": setitem,
        "special": special,
    }


class ChoiceNotes:
    """The function mode of `make_choice_notes`, which makes it a TorchFunctionMode with the
    tables it reads (`choice_tables`) and the trace, target and device as class attributes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.nested:
            return with_mode_inside(self, func, args, kwargs)
        if func is self.torch.Tensor.backward:  # what its body calls, with the mode on
            names = ("gradient", "retain_graph", "create_graph")
            call = dict(zip(names, args[1:], strict=False))
            call.update(kwargs)
            return with_mode_inside(
                self, self.torch.autograd.backward, (args[0], call.get("gradient")),
                {"retain_graph": call.get("retain_graph"),
                 "create_graph": call.get("create_graph", False),
                 "inputs": call.get("inputs")},
            )  # fmt: skip
        if func in self.checked:
            self.trace.checks_passing += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.trace.checks_passing -= 1
        if func not in self.special:
            return func(*args, **kwargs)
        if func is self.sdpa and self.target is not None:
            return sdpa_as_on_gpu(self.torch, self.trace, self.target, func, args, kwargs)
        if func in self.ctc:
            loss, why = ctc_loss.ctc_loss_as_on_gpu(self.torch, func, args, kwargs)
            if why is not None:
                raise TraceStopped(why)
            return loss
        if func in self.other_ways:
            noted = self.other_ways[func](self.torch, args, kwargs)
            if noted is not None:
                self.trace.notes.setdefault(noted, OTHER_WAY)
            return func(*args, **kwargs)
        if func in self.recurrent and self.target is not None and self.target.cudnn() is not None:
            routed = cudnn_rnn.rnn_as_on_gpu(
                self.torch, func, args, kwargs, self.held, self.target.name
            )
            if routed is not None:
                if cudnn_rnn.packed(args):
                    self.trace.notes.setdefault(cudnn_rnn.PACKED_CALLS, cudnn_rnn.PACKED_WHY)
                return routed
        if func in self.from_data and args and not isinstance(args[0], self.torch.Tensor):
            device = self.torch.device(kwargs.get("device") or "cpu")
            if device.type in ("meta", "cuda"):
                kwargs = dict(kwargs, device="cpu")
                grad = kwargs.pop("requires_grad", False)
                kwargs.pop("pin_memory", None)
                return func(*args, **kwargs).to(device).requires_grad_(grad)
        if not self.meta:
            return func(*args, **kwargs)
        if func is self.setitem and len(args) == 3 and type(args[2]) in (bool, int, float):
            number = self.torch.tensor(args[2], dtype=args[0].dtype)  # on the CPU, as for CUDA
            return func(args[0], args[1], number)
        if func in self.cells and self.target is not None and args and args[0].dim() == 2:
            return fused_cells.cell_as_on_gpu(self.torch, func, args, kwargs)
        if func in self.dropouts:
            fused = dropout_as_on_gpu(self.torch, self.dropouts[func], args, kwargs)
            if fused is not None:
                return fused
        if func in self.batch_norms and self.target is not None and self.target.cudnn() is not None:
            return batch_norm_as_on_gpu(self.torch, self.batch_norms[func], func, args, kwargs)
        name = self.functions.get(func)
        if name is not None:
            self.trace.notes.setdefault(name, META_CHOICES[name])
        return func(*args, **kwargs)


def run_trace(torch, device: str, drive, fake: bool = True, target=None) -> Trace:
    """drive(phase) runs the whole protocol, phase by phase. Exceptions that say the trace
    cannot follow the code stop it (Trace.stopped); any other exception propagates. target:
    the GPU (attention_choice.TargetGpu) whose kernel choices a meta trace makes; None: the
    meta device's own."""
    limits = torch_private.fake_tensor_limits()
    tracer = Tracer(torch, device, fake, target)
    try:
        with tracer:
            drive(tracer.phase)
    except limits as exc:
        func = getattr(exc, "func", None)
        where = f" at {func}" if func is not None else ""
        tracer.trace.stopped = (
            f"the trace cannot follow the code{where} ({type(exc).__name__}): the shapes or "
            "the operator depend on values or kernels a fake tensor does not have"
        )
    except TraceStopped as exc:
        tracer.trace.stopped = str(exc)
    return tracer.trace
