"""Generated (tests/benchmarks/idiom_points.py): family=gpt2, build=device_context, mode=eval, step=adamw, loss=by_hand, upcast=float, returns=tuple, extra=none, dtype=bfloat16."""

import torch
from own_model import Workload


def Model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2,
                                      n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


def point(config):
    with torch.device(config.device):
        model = Model()
    model = model.to(config.dtype)
    model.eval()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model, inputs):
        out = model(input_ids=inputs)
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        return -logp.gather(-1, inputs.unsqueeze(-1)).mean()

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
