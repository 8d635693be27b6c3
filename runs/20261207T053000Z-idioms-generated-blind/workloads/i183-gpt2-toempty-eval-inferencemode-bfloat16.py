"""Generated (tests/benchmarks/idiom_points.py): family=gpt2, build=to_empty, mode=eval, step=inference_mode, loss=nn, upcast=kept, returns=dict, extra=hook, dtype=bfloat16."""

import torch
from own_model import Workload


def Model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=256, n_embd=128, n_layer=2,
                                      n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


def point(config):
    with torch.device("meta"):
        model = Model()
    model = model.to_empty(device=config.device).to(config.dtype)
    model.tie_weights()  # to_empty unties them
    model.eval()
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output))
    make_inputs = lambda: torch.randint(0, 1000, (config.batch, 64), device=config.device)

    def step(model, inputs):
        with torch.inference_mode():
            out = (seen.clear(), model(input_ids=inputs))[1]
            return {"logits": out.logits}

    return Workload(model, make_inputs, step=step)
