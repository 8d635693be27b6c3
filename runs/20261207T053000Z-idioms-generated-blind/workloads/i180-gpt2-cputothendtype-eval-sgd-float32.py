"""Generated (tests/benchmarks/idiom_points.py): family=gpt2, build=cpu_to_then_dtype, mode=eval, step=sgd, loss=by_hand, upcast=float, returns=tensor, extra=dropout, dtype=float32."""

import torch
from own_model import Workload


def Model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2,
                                      n_head=4, resid_pdrop=0.1, embd_pdrop=0.1,
                                      attn_pdrop=0.1))


def point(config):
    model = Model().to(config.device).to(config.dtype)
    model.eval()
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    def step(model, inputs):
        out = model(input_ids=inputs)
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        return -logp.gather(-1, inputs.unsqueeze(-1)).mean()

    return Workload(model, make_inputs, step=step, optimizer=optimizer)
