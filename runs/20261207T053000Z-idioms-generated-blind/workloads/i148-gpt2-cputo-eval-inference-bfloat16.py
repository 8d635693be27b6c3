"""Generated (tests/benchmarks/idiom_points.py): family=gpt2, build=cpu_to, mode=eval, step=inference, loss=nn, upcast=kept, returns=output, extra=dropout, dtype=bfloat16."""

import torch
from own_model import Workload


def Model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2,
                                      n_head=4, resid_pdrop=0.1, embd_pdrop=0.1,
                                      attn_pdrop=0.1))


def point(config):
    model = Model().to(device=config.device, dtype=config.dtype)
    model.eval()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    return Workload(model, make_inputs)
