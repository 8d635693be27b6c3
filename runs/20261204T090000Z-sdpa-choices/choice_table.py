"""On a CUDA GPU: the SDPA kernel PyTorch picks for every case of attention_choice.choice_cases().

    python3 choice_table.py OUT.json

Each case's tensors are made on the GPU with the case's shapes, strides and grad setting, and
torch._fused_sdp_choice (what scaled_dot_product_attention calls to pick) says the backend;
a call PyTorch refuses is recorded with backend null and the error's first line.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pipeline"))
import attention_choice as ac  # noqa: E402
import torch  # noqa: E402

NAMES = {0: ac.MATH, 1: ac.FLASH, 2: ac.EFFICIENT, 3: ac.CUDNN}


def tensor(shape, stride, dtype, grad):
    storage = torch.empty(ac.storage_numel(shape, stride), device="cuda", dtype=dtype)
    view = storage.as_strided(shape, stride)
    return view.detach().requires_grad_(grad)


def main() -> int:
    started = time.perf_counter()
    rows = []
    for case in ac.choice_cases():
        dtype = getattr(torch, case["dtype"])
        grad = case["grad"] != "none"
        q, k, v = (tensor(case[f"{n}_shape"], case[f"{n}_stride"], dtype, grad) for n in "qkv")
        mask = None
        if case["mask_shape"] is not None:
            mask = torch.zeros(case["mask_shape"], device="cuda",
                               dtype=getattr(torch, case["mask_dtype"]))
        row = {k: (list(v) if isinstance(v, tuple) else v) for k, v in case.items()}
        with torch.set_grad_enabled(case["grad"] != "requires_grad_no_grad"):
            try:
                choice = torch._fused_sdp_choice(q, k, v, mask, case["dropout_p"],
                                                 case["is_causal"], enable_gqa=case["enable_gqa"])
                row["backend"] = NAMES[int(choice)]
            except RuntimeError as exc:
                row["backend"] = None
                row["error"] = str(exc).strip().splitlines()[0][:300]
        rows.append(row)
        del q, k, v, mask
    props = torch.cuda.get_device_properties(0)
    table = {
        "gpu": props.name,
        "capability": [props.major, props.minor],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "seconds": round(time.perf_counter() - started, 1),
    }
    head = json.dumps(table, indent=1)[:-2]  # one case a line below: the file stays readable
    body = ",\n".join(json.dumps(row) for row in rows)
    Path(sys.argv[1]).write_text(f'{head},\n "rows": [\n{body}\n]}}\n')
    counts = {}
    for row in rows:
        counts[row["backend"]] = counts.get(row["backend"], 0) + 1
    print(f"{len(rows)} cases in {table['seconds']} s: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
