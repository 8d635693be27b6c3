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


# Public configurations by their Hugging Face hub repository: its config.json's fields
# num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim,
# intermediate_size, vocab_size, tie_word_embeddings, rope_theta, rms_norm_eps, in Shape's
# order, a trailing default left out. Qwen2 projects q, k and v with a bias (its modelling code,
# not a config field); the others have none.
PUBLISHED = {
    "meta-llama/Llama-3.2-1B": Shape(16, 2048, 32, 8, 64, 8192, 128256, True, False, 5e5),
    "meta-llama/Llama-3.2-3B": Shape(28, 3072, 24, 8, 128, 8192, 128256, True, False, 5e5),
    "meta-llama/Llama-3.1-8B": Shape(32, 4096, 32, 8, 128, 14336, 128256, False, False, 5e5),
    "Qwen/Qwen2.5-7B": Shape(28, 3584, 28, 4, 128, 18944, 152064, False, True, 1e6, 1e-6),
    "mistralai/Mistral-7B-v0.3": Shape(32, 4096, 32, 8, 128, 14336, 32768, False, False, 1e6),
}
# name: (shape, the config.json it was taken from); a preset is named as its repository, in
# lower case.
PRESETS = {
    repo.split("/")[1].lower(): (shape, f"https://huggingface.co/{repo}/blob/main/config.json")
    for repo, shape in PUBLISHED.items()
}


def parameter_tensors(shape: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, dims, initialisation) in the order the model allocates them. A tied LM head is
    the embedding itself and has no entry."""
    d, q_out, kv_out = shape.width, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    tensors = [("embed", (shape.vocab, d), "normal")]
    for i in range(shape.layers):
        w = f"layers.{i}."
        tensors.append((w + "attn_norm", (d,), "ones"))
        for name, out in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            tensors.append((w + name, (out, d), "normal"))
            if shape.qkv_bias:
                tensors.append((w + name + "_bias", (out,), "zeros"))
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
