"""A Hugging Face config.json as the lab reads it (`--hf-config`), checked before transformers
sees it, and the budget of the trace it would make.

A bad config is bad input: one line naming the file and the field, exit 2, nothing written;
never "the workload raised", which is the user's own code failing. The limits:

- the file: at most MAX_CONFIG_BYTES, refused from its size before it is read; nested at
  most MAX_CONFIG_DEPTH levels; no key twice in one object (json_input.py);
- every size field the lab knows (SIZE_FIELDS: layers, heads, widths, vocabulary,
  positions, image sides), at the top level and in a nested `*_config` object: an integer
  from 1 to its limit (null where transformers then takes its own default: NULLABLE);
- the attention heads divide the width where no head_dim says otherwise, and the key/value
  heads divide the attention heads;
- a rotary embedding's rope_type is one transformers has (checked with transformers
  imported, in hf_model.check, before it reads the config).

The limits are well above every published model (Llama 3.1 405B: 126 layers, width 16,384,
128 heads, feed-forward 53,248; Gemma 3: vocabulary 262,144; Llama 4 Scout: 10,485,760
positions) and low enough that no tensor size overflows PyTorch's 64-bit byte count.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core import cli, json_input

MAX_CONFIG_BYTES = 4 << 20  # 4 MiB: a published config.json is a few kB (id2label: 1 MB)
MAX_CONFIG_DEPTH = 32  # a config.json is a few levels deep
LAYERS, HEADS, WIDTH = 1024, 4096, 1 << 20
VOCABULARY, POSITIONS, IMAGE_SIDE, CHANNELS, LABELS = 1 << 24, 1 << 24, 1 << 16, 1024, 1 << 20
SIZE_FIELDS = {
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers",
         "encoder_layers", "decoder_layers"),
        (LAYERS, "layers"),
    ),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "num_kv_heads",
         "encoder_attention_heads", "decoder_attention_heads"),
        (HEADS, "heads"),
    ),
    **dict.fromkeys(
        ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "ffn_dim",
         "encoder_ffn_dim", "decoder_ffn_dim", "head_dim", "d_kv", "embedding_size"),
        (WIDTH, "a width"),
    ),
    "vocab_size": (VOCABULARY, "a vocabulary"),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), (POSITIONS, "positions")),
    **dict.fromkeys(("image_size", "patch_size"), (IMAGE_SIDE, "an image side")),
    "num_channels": (CHANNELS, "channels"),
    "num_labels": (LABELS, "labels"),
}  # fmt: skip
NULLABLE = ("n_inner", "head_dim", "num_key_value_heads", "num_kv_heads", "intermediate_size")
# (width, heads, the field that sets each head's size apart from the width)
HEAD_SPLITS = (
    ("hidden_size", "num_attention_heads", "head_dim"),
    ("n_embd", "n_head", "head_dim"),
    ("d_model", "num_heads", "d_kv"),
    ("d_model", "encoder_attention_heads", "head_dim"),
    ("d_model", "decoder_attention_heads", "head_dim"),
)
KV_SPLITS = (
    ("num_attention_heads", "num_key_value_heads"),
    ("num_attention_heads", "num_kv_heads"),
)
# The trace's budget: every decoder layer once per forward pass, each layer pass some 10 to
# 25 ms on a 2-core CPU; the default admits Llama 3.1 8B generating 128 tokens (32 layers x
# 128 forwards x 4 steps: 16,384) and refuses what would run for over about 10 minutes.
LAYER_PASS_BUDGET = 20_000
# No tensor of the trace may be larger: fake tensors cost nothing, but one of 1 PiB fits on no
# GPU (the largest holds 288 GB) by three orders of magnitude, and past 2**63 bytes PyTorch
# fails on its own byte count. The attention scores count as the trace makes them on a
# machine without a GPU (the math kernel: the whole matrix), which admits 128k-token contexts.
MAX_TENSOR_BYTES = 1 << 50
# peft makes a LoRA model's adapters in host memory (float32) before they reach the device:
# the trace of a rank near the width of a large model would take the host's memory.
MAX_ADAPTER_HOST_BYTES = 4 << 30


def read(path: Path) -> dict:
    """The config.json's object, or one line naming the file and what is wrong."""
    if not path.exists():
        raise cli.UsageError(f"--hf-config {path}: no such file")
    if not path.is_file():
        raise cli.UsageError(f"--hf-config {path}: not a file")
    try:
        data = json_input.read_limited(path, MAX_CONFIG_BYTES)
        config = json_input.loads(data, constants=True, max_depth=MAX_CONFIG_DEPTH)
    except (UnicodeDecodeError, json_input.JsonInputError) as exc:
        why = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else exc
        raise cli.UsageError(f"--hf-config {path}: not JSON the lab reads ({why})") from None
    if not isinstance(config, dict):
        raise cli.UsageError(f"--hf-config {path}: not a JSON object")
    return config


def sections(config: dict) -> list[tuple[str, dict]]:
    """The config and each nested `*_config` object (a multimodal model's text_config...)."""
    found = [("", config)]
    for key, value in config.items():
        if key.endswith("_config") and key != "quantization_config" and isinstance(value, dict):
            found.append((f"{key}.", value))
    return found


def check_sizes(config: dict, path: Path) -> None:
    """Every size field an integer within its limit, and the heads splitting the width."""
    for prefix, section in sections(config):
        for key, (limit, what) in SIZE_FIELDS.items():
            if key not in section or (section[key] is None and key in NULLABLE):
                continue
            value = section[key]
            # a list gives one value a stage (LeViT's heads, Swin's depths, an image's sides)
            values = value if isinstance(value, list) else [value]
            if not values or not all(type(v) is int and 1 <= v <= limit for v in values):
                raise cli.UsageError(
                    f"--hf-config {path}: {prefix}{key} is {short(value)}, not an integer from 1 "
                    f"to {limit:,} (the lab's limit for {what})"
                )
        for width, heads, head_size in HEAD_SPLITS:
            w, h = section.get(width), section.get(heads)
            sized = section.get(head_size) is not None
            if isinstance(w, int) and isinstance(h, int) and not sized and w % h:
                raise cli.UsageError(
                    f"--hf-config {path}: {prefix}{width} {w} is not a multiple of "
                    f"{prefix}{heads} {h}: each head takes an equal part of the width "
                    f"(or {head_size} says its size)"
                )
        for heads, kv in KV_SPLITS:
            h, k = section.get(heads), section.get(kv)
            if isinstance(h, int) and isinstance(k, int) and h % k:
                raise cli.UsageError(
                    f"--hf-config {path}: {prefix}{heads} {h} is not a multiple of {prefix}{kv} "
                    f"{k}: each key/value head serves a whole group of attention heads"
                )


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def check_rope(config: dict, path: Path) -> None:
    """Each rope_type the config names (rope_scaling or rope_parameters, one for the model or
    one per layer type) is one transformers initialises: of another, transformers only warns,
    then fails with KeyError as the model is built. Checked before transformers reads it."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    known = {"default", *ROPE_INIT_FUNCTIONS}
    for prefix, section in sections(config):
        for key in ("rope_scaling", "rope_parameters"):
            value = section.get(key)
            if not isinstance(value, dict):
                continue
            nested = [v for v in value.values() if isinstance(v, dict)]
            for entry in nested or [value]:
                kind = entry.get("rope_type", entry.get("type", "default"))
                if kind not in known:
                    raise cli.UsageError(
                        f"--hf-config {path}: {prefix}{key}.rope_type is {short(kind)}, not one "
                        f"transformers has ({', '.join(sorted(known))})"
                    )


def largest(config, name: str, default: int) -> int:
    """A size field's value, the largest stage's where the config gives one a stage (LeViT's
    heads and widths are lists); `default` where the field is absent or empty."""
    value = getattr(config, name, None)
    if isinstance(value, (list, tuple)):
        value = max((v for v in value if isinstance(v, int)), default=None)
    return value or default


def layer_count(built) -> int:
    """The layers one forward pass runs: the text model's, and a decoder's beside its encoder."""
    text = built.get_text_config()
    layers = largest(text, "num_hidden_layers", 1)
    if getattr(built, "is_encoder_decoder", False):
        decoder = getattr(built, "num_decoder_layers", None) or getattr(
            built, "decoder_layers", None
        )
        layers += decoder or layers
    return layers


def over_budget(built, task: str, dims: dict, batch: int, steps: int, budget: int) -> str | None:
    """Why the trace of this model and run is refused up front, or None: the layer passes it
    would run (steps x layers x forwards a step), then the largest tensor it would make."""
    layers = layer_count(built)
    forwards = dims.get("new_tokens", 1) if task == "generate" else 1
    passes = steps * layers * forwards
    if passes > budget:
        return (
            f"the trace would run {passes:,} layer passes ({steps} steps x {layers} layers x "
            f"{forwards} forward{'s' if forwards > 1 else ''}), over the estimate budget of "
            f"{budget:,} (--layer-pass-budget)"
        )
    text = built.get_text_config()
    width = largest(text, "hidden_size", 1)
    if "lora_rank" in dims:  # peft makes the adapters in host memory, whatever the device
        adapters = layers * 4 * dims["lora_rank"] * 2 * width * 4  # q, k, v, o: A and B
        if adapters > MAX_ADAPTER_HOST_BYTES:
            return (
                f"--lora-rank {dims['lora_rank']}: peft would make about {adapters:,} bytes of "
                f"adapters in host memory ({layers} layers, width {width}), over the limit of "
                f"{MAX_ADAPTER_HOST_BYTES:,} bytes (4 GiB)"
            )
    heads = largest(text, "num_attention_heads", 1)
    vocab = largest(text, "vocab_size", 1)
    ffn = largest(text, "intermediate_size", 4 * width)
    if "image" in dims:
        side, patch = dims["image"], getattr(built, "patch_size", None)
        patch = patch if isinstance(patch, int) else 1
        tokens = max(1, (side // patch) ** 2)
        candidates = {"the images": batch * getattr(built, "num_channels", 3) * side * side}
    else:
        tokens = dims.get("sequence", 1) + (dims.get("new_tokens", 1) - 1)
        candidates = {"the logits": batch * tokens * vocab, "the embedding": vocab * width}
    candidates["the attention scores"] = batch * heads * tokens * tokens
    candidates["the feed-forward activations"] = batch * tokens * max(ffn, width)
    what, elements = max(candidates.items(), key=lambda item: item[1])
    size = elements * 4  # float32: what the largest tensors are computed in
    if size > MAX_TENSOR_BYTES:
        return (
            f"the trace would make a tensor of about {size:,} bytes ({what}, float32), over "
            f"{MAX_TENSOR_BYTES:,} bytes (1 PiB): no GPU holds it"
        )
    return None
