"""Generated (tests/benchmarks/idiom_points.py): family=gpt2, build=cpu_to_then_dtype, mode=train, step=sgd, loss=nn, upcast=kept, returns=output, extra=in_place, dtype=bfloat16."""

import torch
from own_model import Workload


def Model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2,
                                      n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


def point(config):
    model = Model().to(config.device).to(config.dtype)
    model.train()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    def step(model, inputs):
        out = model(input_ids=inputs)
        logits = out.logits
        return torch.nn.CrossEntropyLoss()(logits.reshape(-1, 1000), inputs.reshape(-1))

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
