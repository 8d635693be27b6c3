"""Generated (tests/benchmarks/idiom_points.py): family=llama, build=cpu_to, mode=eval, step=inference, loss=nn, upcast=kept, returns=output, extra=hook, dtype=bfloat16."""

import torch
from own_model import Workload


def Model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=512,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=256,
                                        attention_dropout=0.0, tie_word_embeddings=True))


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output))
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    return Workload(model, make_inputs)
