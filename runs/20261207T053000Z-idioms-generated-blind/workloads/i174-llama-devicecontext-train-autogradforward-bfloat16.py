"""Generated (tests/benchmarks/idiom_points.py): family=llama, build=device_context, mode=train, step=autograd_forward, loss=by_hand, upcast=kept, returns=dict, extra=dropout, dtype=bfloat16."""

import torch
from own_model import Workload


def Model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=512,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=256,
                                        attention_dropout=0.1, tie_word_embeddings=True))


def point(config):
    with torch.device(config.device):
        model = Model()
    model = model.to(config.dtype)
    model.train()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)

    def step(model, inputs):
        out = model(input_ids=inputs)
        return {"logits": out.logits}

    return Workload(model, make_inputs, step=step)
