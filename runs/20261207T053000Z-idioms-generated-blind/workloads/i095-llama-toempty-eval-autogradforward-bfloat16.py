"""Generated (tests/benchmarks/idiom_points.py): family=llama, build=to_empty, mode=eval, step=autograd_forward, loss=by_hand, upcast=float, returns=tuple, extra=buffer, dtype=bfloat16."""

import torch
from own_model import Workload


def Model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=512,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=256,
                                        attention_dropout=0.0, tie_word_embeddings=True))


def point(config):
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.tie_weights()  # to_empty unties them
    model.eval()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)

    def step(model, inputs):
        out = model(input_ids=inputs)
        return out.logits.float(), out.logits.argmax(-1)

    return Workload(model, make_inputs, step=step)
