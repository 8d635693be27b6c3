"""Generated (tests/benchmarks/idiom_points.py): family=llama, build=cpu_to, mode=eval, step=adamw, loss=nn, upcast=float, returns=tuple, extra=dropout, dtype=float32."""

import torch
from own_model import Workload


def Model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=512,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=256,
                                        attention_dropout=0.1, tie_word_embeddings=True))


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model, inputs):
        out = model(input_ids=inputs)
        logits = out.logits.float()
        return torch.nn.CrossEntropyLoss()(logits.reshape(-1, 1000), inputs.reshape(-1))

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
