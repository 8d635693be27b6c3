"""The fused inference "fast path" of nn.MultiheadAttention and nn.TransformerEncoderLayer,
taken by the trace where a GPU takes it.

Both modules' `forward` (torch/nn/modules/activation.py and transformer.py) call one fused
operator, `torch._native_multi_head_attention` or `torch._transformer_encoder_layer_fwd`,
when a list of conditions holds (evaluation mode, batch first, even heads, no hooks...), the
last three being: no tensor argument has a torch function, each is on a supported device
(cpu, cuda...), and not (grad enabled and one of them requires grad). Fake tensors always
have a torch function, so without help the trace would take the module's general path,
which a GPU does not take. Asked at that very check (`has_torch_function`, called from the
module's forward once the earlier conditions held), the trace answers for the GPU: the
device is supported, so the fast path is taken unless grad is enabled and an argument
requires it. Then the module's call is made as its forward makes it, from its own locals at
that point (the masks already canonical): `merge_masks`, then the fused operator, whose
output a fake kernel gives (PyTorch 2.11 has no meta kernel for the encoder layer's).

What the fused kernels allocate inside (the projections, the attention's scores or an
SDPA kernel, the norms, the feed-forward's hidden layer) is one operator call to the trace:
calibrated where a GPU probed that call (`measure`), otherwise not covered, with a bound
(`scratch_terms`) that counts every one of those blocks as if alive at once, read from
PyTorch's transformer.cpp and native_multi_head_attention_cuda (attention.cu).

TransformerEncoder's own fast path (a padding mask turned into a nested tensor, whose sizes
come from the mask's values) is not followed: noted, the prediction gets no bounds.
"""

from __future__ import annotations

import os
import sys

from pipeline.core import torch_private
from pipeline.core.call_keys import is_tensor_leaf
from pipeline.predicting.reduce_scratch import ELEMENT_SIZE

FILES = (
    os.path.join("nn", "modules", "transformer.py"),
    os.path.join("nn", "modules", "activation.py"),
)
ENCODER_LAYER = "aten._transformer_encoder_layer_fwd.default"
ATTENTION = "aten._native_multi_head_attention.default"
FUSED = (ENCODER_LAYER, ATTENTION)
NOTE = (
    "a real run takes PyTorch's fused kernels here (the fast path of inference), which the "
    "trace cannot follow (its tensors are a subclass): it traced the general path instead"
)


class _Taken(Exception):
    """Raised from has_torch_function where the GPU takes the fast path; carries the
    forward's locals to the module's wrapper, which makes the fused call."""

    def __init__(self, frame_locals: dict) -> None:
        super().__init__()
        self.locals = frame_locals


def _encoder_layer_call(torch, layer, found: dict):
    """The call TransformerEncoderLayer.forward makes on its fast path."""
    src, attention = found["src"], layer.self_attn
    masks = attention.merge_masks(found["src_mask"], found["src_key_padding_mask"], src)
    return torch_private.fast_path_operators(torch)[0](
        src, attention.embed_dim, attention.num_heads, attention.in_proj_weight,
        attention.in_proj_bias, attention.out_proj.weight, attention.out_proj.bias,
        layer.activation_relu_or_gelu == 2, layer.norm_first, layer.norm1.eps,
        layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias,
        layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias,
        *masks,
    )  # fmt: skip


def _attention_call(torch, attention, found: dict):
    """The call MultiheadAttention.forward makes on its fast path (with both biases)."""
    merged_mask, mask_type = attention.merge_masks(
        found["attn_mask"], found["key_padding_mask"], found["query"]
    )
    return torch_private.fast_path_operators(torch)[1](
        found["query"], found["key"], found["value"], attention.embed_dim, attention.num_heads,
        attention.in_proj_weight, attention.in_proj_bias, attention.out_proj.weight,
        attention.out_proj.bias, merged_mask, found["need_weights"],
        found["average_attn_weights"], mask_type,
    )  # fmt: skip


def _encoder_layer_fake(fake_mode, func, src, *args, **kwargs):
    """transformer_encoder_layer_forward's output: a new tensor of src's shape (the last
    layer norm's, or src's clone when empty). PyTorch 2.11 has no meta kernel for it."""
    with fake_mode:
        return src.clone() if src.numel() == 0 else src.new_empty(src.shape)


def install(torch, notes: dict):
    """Patch has_torch_function and the two modules' forward for the trace's time; returns
    the undo. `notes` gets TransformerEncoder's own fast path where a real run takes it."""
    nn, overrides = torch.nn, torch.overrides
    original = overrides.has_torch_function
    calls = {
        nn.TransformerEncoderLayer: _encoder_layer_call,
        nn.MultiheadAttention: _attention_call,
    }
    forwards = {cls: cls.forward for cls in calls}

    def has_torch_function(args):
        answer = original(args)
        caller = sys._getframe(1)
        if not answer or not caller.f_code.co_filename.endswith(FILES):
            return answer
        found = caller.f_locals
        module = found.get("self")
        for cls, forward in forwards.items():
            if isinstance(module, cls) and caller.f_code is forward.__code__:
                tensors = found.get("tensor_args", ())
                if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                    return answer  # the general path, on a GPU too
                if cls is nn.MultiheadAttention and module.in_proj_bias is None:
                    return answer  # no fused call without the projections' biases
                raise _Taken(dict(found))
        notes.setdefault(f"{type(module).__name__} fast path", NOTE)
        return answer

    def wrap(cls):
        forward = forwards[cls]

        def fast_or_general(self, *args, **kwargs):
            try:
                return forward(self, *args, **kwargs)
            except _Taken as taken:
                return calls[cls](torch, self, taken.locals)

        return fast_or_general

    overrides.has_torch_function = has_torch_function
    for cls in calls:
        cls.forward = wrap(cls)
    layer = torch_private.fast_path_operators(torch)[0]
    unfake = torch_private.add_fake_kernel(layer, _encoder_layer_fake)

    def undo():
        unfake()
        overrides.has_torch_function = original
        for cls, forward in forwards.items():
            cls.forward = forward

    return undo


def scratch_terms(name: str, arguments: dict) -> tuple[int, int] | None:
    """For a fused call's bound: the attention's scores (batch x heads x queries x keys) and
    the feed-forward's hidden bytes (batch x tokens x linear1's width, twice: the activation's
    output and one more of its size), or None for another operator."""
    if name == ENCODER_LAYER:
        src, weight = arguments.get("src"), arguments.get("ffn_weight_1")
        heads = arguments.get("num_heads")
        if (
            not (is_tensor_leaf(src) and is_tensor_leaf(weight) and isinstance(heads, int))
            or len(src[2]) != 3
        ):
            return None
        batch, tokens, _ = src[2]
        hidden = 2 * batch * tokens * weight[2][0] * ELEMENT_SIZE.get(src[1], 8)
        return batch * heads * tokens * tokens, hidden
    if name == ATTENTION:
        query, key = arguments.get("query"), arguments.get("key")
        heads = arguments.get("num_head")
        if not (is_tensor_leaf(query) and is_tensor_leaf(key) and isinstance(heads, int)):
            return None
        if len(query[2]) != 3 or len(key[2]) != 3:
            return None
        return query[2][0] * heads * query[2][1] * key[2][1], 0
    return None
