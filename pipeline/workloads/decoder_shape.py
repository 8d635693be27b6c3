"""The decoder's architecture, as data: its shape, the public presets, its parameter tensors
in the order the model allocates them, and the attention kernels' names as files write them.

Standard library only. The model (`decoder_model.py`, PyTorch) and its predictor and command
line (`decoder.py`, no PyTorch for `estimate`) both read it, and neither imports the other
for it: `decoder.py measure` imports the model, the model imports only this.
"""

from __future__ import annotations

import dataclasses
import math

# torch.nn.attention.SDPBackend names, as the files write them.
BACKEND_NAMES = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "efficient",
    "CUDNN_ATTENTION": "cudnn",
    "MATH": "math",
}


@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int
    width: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5


# Public configurations (config.json on the Hugging Face hub, the fields hidden_size,
# intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
# vocab_size, tie_word_embeddings, rope_theta, rms_norm_eps). Qwen2 projects q, k and v with a
# bias (its modelling code, not a config field); the others have none.
PRESETS = {
    "llama-3.2-1b": (
        Shape(16, 2048, 32, 8, 64, 8192, 128256, True, False, 500000.0, 1e-5),
        "https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
    ),
    "llama-3.2-3b": (
        Shape(28, 3072, 24, 8, 128, 8192, 128256, True, False, 500000.0, 1e-5),
        "https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json",
    ),
    "llama-3.1-8b": (
        Shape(32, 4096, 32, 8, 128, 14336, 128256, False, False, 500000.0, 1e-5),
        "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
    ),
    "qwen2.5-7b": (
        Shape(28, 3584, 28, 4, 128, 18944, 152064, False, True, 1000000.0, 1e-6),
        "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json",
    ),
    "mistral-7b-v0.3": (
        Shape(32, 4096, 32, 8, 128, 14336, 32768, False, False, 1000000.0, 1e-5),
        "https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json",
    ),
}


def parameter_tensors(shape: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, dims, initialisation) in the order the model allocates them. A tied LM head is
    the embedding itself and has no entry."""
    d, q_out, kv_out = shape.width, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    tensors = [("embed", (shape.vocab, d), "normal")]
    for i in range(shape.layers):
        w = f"layers.{i}."
        tensors.append((w + "attn_norm", (d,), "ones"))
        tensors.append((w + "q", (q_out, d), "normal"))
        if shape.qkv_bias:
            tensors.append((w + "q_bias", (q_out,), "zeros"))
        tensors.append((w + "k", (kv_out, d), "normal"))
        if shape.qkv_bias:
            tensors.append((w + "k_bias", (kv_out,), "zeros"))
        tensors.append((w + "v", (kv_out, d), "normal"))
        if shape.qkv_bias:
            tensors.append((w + "v_bias", (kv_out,), "zeros"))
        tensors.append((w + "o", (d, q_out), "normal"))
        tensors.append((w + "mlp_norm", (d,), "ones"))
        tensors.append((w + "gate", (shape.ffn, d), "normal"))
        tensors.append((w + "up", (shape.ffn, d), "normal"))
        tensors.append((w + "down", (d, shape.ffn), "normal"))
    tensors.append(("final_norm", (d,), "ones"))
    if not shape.tie_embeddings:
        tensors.append(("lm_head", (shape.vocab, d), "normal"))
    return tensors


def parameter_count(shape: Shape) -> int:
    return sum(math.prod(dims) for _, dims, _ in parameter_tensors(shape))
