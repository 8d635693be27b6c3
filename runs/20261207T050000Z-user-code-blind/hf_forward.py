"""transformers models built from a config written in the file, on the CPU and then moved (the
idiom most tutorials show), run forward with autograd on: the step returns the logits, so the
graph they hold lives until the next step."""

import torch
from own_model import Workload


def _llama_config(layers, width, vocab, tie):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=4 * width,
        num_hidden_layers=layers, num_attention_heads=width // 64, num_key_value_heads=max(1, width // 256),
        max_position_embeddings=4096, tie_word_embeddings=tie,
    )


def _forward(model, config, vocab, length):
    def make_inputs():
        return torch.randint(0, vocab, (config.batch, length), device=config.device)

    return Workload(model, make_inputs, step=lambda model, ids: model(input_ids=ids).logits)


def llama(config, *, layers=16, width=2048, vocab=32000, length=2048):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(_llama_config(layers, width, vocab, False))
    model = model.to(device=config.device, dtype=config.dtype)
    return _forward(model, config, vocab, length)


def llama_no_cache(config, *, layers=16, width=2048, vocab=32000, length=2048):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(_llama_config(layers, width, vocab, False))
    model = model.to(device=config.device, dtype=config.dtype)

    def make_inputs():
        return torch.randint(0, vocab, (config.batch, length), device=config.device)

    step = lambda model, ids: model(input_ids=ids, use_cache=False).logits
    return Workload(model, make_inputs, step=step)


def gemma2(config, *, layers=4, width=512, vocab=16000, length=512):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=vocab, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=True, attn_implementation="eager",
    )
    model = Gemma2ForCausalLM(cfg).to(device=config.device, dtype=config.dtype)
    return _forward(model, config, vocab, length)


def llama_tied(config, *, layers=2, width=512, vocab=32000, length=512):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(_llama_config(layers, width, vocab, True))
    model = model.to(device=config.device, dtype=config.dtype)
    return _forward(model, config, vocab, length)
