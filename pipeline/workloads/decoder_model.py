"""The decoder's PyTorch side: weights made on the device, a forward whose allocations can be
read off the code, greedy generation with a preallocated KV cache.

Run by `decoder.py measure` on the GPU and, through the same phase driver, traced on the meta
device by `decoder.py estimate` (trace_prediction.py): what is predicted is this code.

How the weights are made. Every parameter is created where it lives, `torch.empty` on the
measured device in the measured dtype, then filled in place from one seeded generator on that
device: normal(0, 0.02) for the embedding and the projections, 1 for the RMSNorm weights, 0 for
the biases. No host copy and no float32 detour: an 8B-class model in bfloat16 is 16 GB written
by the GPU itself, at its memory bandwidth (model_load's row times it). The values are
random; memory does not depend on them, only the greedy tokens do.

The KV cache is preallocated: one K and one V tensor per layer, (batch, kv_heads, prompt +
new_tokens, head_dim), made once before the prefill and written in place, position by
position. It never grows: a grown cache (torch.cat per token) reallocates and copies at every
step, holds two copies for a moment and fragments the pool, which would measure the growth
strategy rather than the model; serving engines preallocate too. The last generated token is
never fed back, so the cache's last position stays unwritten: it holds P+N positions as users
size it.

Grouped-query attention goes through scaled_dot_product_attention(enable_gqa=True) on views of
the cache: kernels that support it (flash) read each K/V head for its whole group of query
heads, so no (batch, heads, positions, head_dim) expansion exists. Expanding K and V here would
allocate heads/kv_heads times the cache slice at every call, which is what grouped-query
attention saves. The math path (float32: flash takes half types only, memory-efficient
attention has no GQA) expands internally with repeat_interleave and builds the full attention
matrix: the predictor counts both.

What SDPA is given, and why nothing is copied on the way: the cache slices `cache[:, :, :end]`
are views whose last dimension is contiguous; flash takes any batch, head and sequence strides
as long as the last stride is 1, so no `.contiguous()` copy happens. The query is made
(batch, tokens, heads, head_dim)-contiguous and passed transposed, the layout flash works in:
its output comes back in that layout and `transpose(1, 2).reshape(...)` before the output
projection is a view (a copy on the math path when tokens > 1, counted).

Every intermediate is dropped with an explicit `del` as soon as it is dead, in-place ops are
used where the value is not needed again (residual adds, SiLU, the gate product, the RMSNorm
scale), and `out=` writes into views (rotary into the query buffer and straight into the K
cache). Logits are computed for the last position only, as generation needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.core import torch_private
from pipeline.workloads import decoder_shape

INIT_STD = 0.02


# ---------------------------------------------------------------- weights and state


def seeded(device, seed: int):
    """A generator on the device, seeded; on meta (a trace without a GPU: values are not
    made there) none."""
    if torch.device(device).type == "meta":
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def make_weights(shape: decoder_shape.Shape, dtype, device, seed: int) -> dict:
    """Every parameter in parameter_tensors' order (the predictor's), made in place."""
    generator = seeded(device, seed)
    weights = {}
    for name, dims, init in decoder_shape.parameter_tensors(shape):
        tensor = torch.empty(dims, device=device, dtype=dtype)
        if init == "normal":
            tensor.normal_(0.0, INIT_STD, generator=generator)
        else:
            tensor.fill_(1.0 if init == "ones" else 0.0)
        weights[name] = tensor
    if shape.tie_embeddings:
        weights["lm_head"] = weights["embed"]  # the same tensor: no bytes of its own
    return weights


def rope_table(shape: decoder_shape.Shape, positions: int, dtype, device):
    """cos and sin of position x frequency, (positions, head_dim / 2): computed on the host in
    float32 and cast there, so the device sees exactly one allocation for each table.
    Frequencies are the unscaled rotary ones (theta ** (-2i / head_dim)); a preset's rope
    scaling changes values, not memory, and is not applied."""
    half = shape.head_dim // 2
    exponent = torch.arange(0, half, dtype=torch.float32) * 2 / shape.head_dim
    frequencies = torch.pow(torch.tensor(shape.rope_theta, dtype=torch.float32), -exponent)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), frequencies)
    cos = angles.cos().to(dtype).to(device)
    sin = angles.sin().to(dtype).to(device)
    return cos, sin


class State:
    """What generation keeps between steps: the prompt, the generated tokens, the rotary tables
    and the cache, in that order."""

    def __init__(self, shape: decoder_shape.Shape, run: dict, dtype, device, seed: int):
        batch, prompt, new = run["batch"], run["prompt"], run["new_tokens"]
        positions = prompt + new
        generator = seeded(device, seed + 1)
        self.prompt = torch.randint(
            0, shape.vocab, (batch, prompt), generator=generator, device=device
        )
        self.generated = torch.empty((batch, new), dtype=torch.int64, device=device)
        self.cos, self.sin = rope_table(shape, positions, dtype, device)
        cache = (batch, shape.kv_heads, positions, shape.head_dim)
        self.keys, self.values = [], []
        for _ in range(shape.layers):
            self.keys.append(torch.empty(cache, dtype=dtype, device=device))
            self.values.append(torch.empty(cache, dtype=dtype, device=device))


# ---------------------------------------------------------------- the forward


def rms_norm(x, weight, eps: float):
    """x / rms(x) * weight with the statistic in float32 (as the reference implementations
    keep it): the norm (rows, 1) in float32, then the output; the statistic is freed."""
    inverse = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    inverse.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
    out = torch.empty_like(x)
    torch.mul(x, inverse, out=out)  # computed in float32, stored in the model's dtype
    del inverse
    out.mul_(weight)
    return out


def rotate(x, cos, sin, out) -> None:
    """Rotary positions, written into `out` (a buffer or a view of the cache), no temporary:
    out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin, halves of the head dimension."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out1, out2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=out1)
    out1.addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=out2)
    out2.addcmul_(x1, sin)


def attend(query, keys, values, causal: bool, grouped: bool):
    """The one call whose inner blocks are the kernel's own (taken from the calibration)."""
    return F.scaled_dot_product_attention(query, keys, values, is_causal=causal, enable_gqa=grouped)


def block(shape: decoder_shape.Shape, weights: dict, layer: int, state: State, h, position: int):
    """One decoder layer on the residual stream h (batch, tokens, width), updated in place."""
    batch, tokens, _ = h.shape
    heads, kv_heads, head_dim = shape.heads, shape.kv_heads, shape.head_dim
    w = f"layers.{layer}."
    end = position + tokens
    cos = state.cos[position:end].view(1, tokens, 1, head_dim // 2)
    sin = state.sin[position:end].view(1, tokens, 1, head_dim // 2)

    x = rms_norm(h, weights[w + "attn_norm"], shape.rms_norm_eps)
    q = F.linear(x, weights[w + "q"], weights.get(w + "q_bias"))
    k = F.linear(x, weights[w + "k"], weights.get(w + "k_bias"))
    v = F.linear(x, weights[w + "v"], weights.get(w + "v_bias"))
    del x
    query = torch.empty((batch, tokens, heads, head_dim), dtype=h.dtype, device=h.device)
    rotate(q.view(batch, tokens, heads, head_dim), cos, sin, query)
    del q
    key_slot = state.keys[layer][:, :, position:end].transpose(1, 2)
    rotate(k.view(batch, tokens, kv_heads, head_dim), cos, sin, key_slot)
    del k, key_slot
    value_slot = state.values[layer][:, :, position:end]
    value_slot.copy_(v.view(batch, tokens, kv_heads, head_dim).transpose(1, 2))
    del v, value_slot
    attention = attend(
        query.transpose(1, 2),
        state.keys[layer][:, :, :end],
        state.values[layer][:, :, :end],
        causal=tokens > 1,
        grouped=heads != kv_heads,
    )
    del query
    merged = attention.transpose(1, 2).reshape(batch, tokens, heads * head_dim)
    del attention
    o = F.linear(merged, weights[w + "o"])
    del merged
    h.add_(o)
    del o

    x = rms_norm(h, weights[w + "mlp_norm"], shape.rms_norm_eps)
    gate = F.linear(x, weights[w + "gate"])
    up = F.linear(x, weights[w + "up"])
    del x
    F.silu(gate, inplace=True)
    gate.mul_(up)
    del up
    down = F.linear(gate, weights[w + "down"])
    del gate
    h.add_(down)
    del down


def forward(shape: decoder_shape.Shape, weights: dict, state: State, tokens, position: int):
    """tokens (batch, T) at cache positions [position, position + T); returns the greedy next
    token (batch,) int64. Logits for the last position only."""
    h = F.embedding(tokens, weights["embed"])
    for layer in range(shape.layers):
        block(shape, weights, layer, state, h, position)
    x = rms_norm(h[:, -1], weights["final_norm"], shape.rms_norm_eps)
    del h
    logits = F.linear(x, weights["lm_head"])
    del x
    token = torch.argmax(logits, dim=-1)
    del logits
    return token


# ---------------------------------------------------------------- generation


def prefill(shape: decoder_shape.Shape, weights: dict, state: State, holder: list) -> None:
    """The prompt in one pass; its token is generated[:, 0] and waits in `holder` (the caller
    keeps no reference, so each token is freed inside the row that replaces it)."""
    token = forward(shape, weights, state, state.prompt, 0)
    state.generated[:, 0].copy_(token)
    holder.append(token)


def decode(
    shape: decoder_shape.Shape, weights: dict, state: State, holder: list, first: int, count
):
    """Tokens first .. first + count - 1 (indices into generated), one pass each, each fed the
    previous token at cache position prompt + index - 1."""
    prompt = state.prompt.shape[1]
    token = holder.pop()
    for index in range(first, first + count):
        batch = token.shape[0]
        following = forward(shape, weights, state, token.view(batch, 1), prompt + index - 1)
        state.generated[:, index].copy_(following)
        token = following  # the previous token is freed here
        del following
    holder.append(token)


def attention_backends(shape: decoder_shape.Shape, state: State, batch: int) -> dict:
    """The kernel scaled_dot_product_attention picks for the prefill and for a decode step,
    asked of PyTorch's own chooser with tensors of those shapes (after the phases: the query
    it needs is allocated outside every measured row)."""
    from torch.nn.attention import SDPBackend

    names = {member.value: name for name, member in SDPBackend.__members__.items()}
    prompt = state.prompt.shape[1]
    found = {}
    for phase, tokens in (("prefill", prompt), ("decode", 1)):
        end = prompt if phase == "prefill" else prompt + 1
        query = torch.empty(
            (batch, tokens, shape.heads, shape.head_dim),
            dtype=state.keys[0].dtype,
            device=state.keys[0].device,
        ).transpose(1, 2)
        choice = torch_private.fused_sdp_choice(
            torch,
            query,
            state.keys[0][:, :, :end],
            state.values[0][:, :, :end],
            is_causal=tokens > 1,
            enable_gqa=shape.heads != shape.kv_heads,
        )
        found[phase] = decoder_shape.BACKEND_NAMES.get(names.get(choice, str(choice)), str(choice))
        del query
    return found
