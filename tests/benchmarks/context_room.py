"""How much GPU memory the CUDA context takes beside PyTorch's allocator, measured: in a fresh
process per configuration, total minus free right after CUDA start-up, then total minus free
minus reserved after the model, the input and three forward passes (CUDA loads kernels
lazily, on first use, so the context grows after the start). "Fits on this GPU" leaves this
room; calcul_forfaits.py and fit.py carry the H200's figures.

    python3 tests/benchmarks/context_room.py --device cuda:0 --output-dir runs/

Writes <output-dir>/<UTC time>-<random>-context-room/context-room.json. Not a test: it needs
a GPU. Exit 2 with one line when no GPU can be used.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root

import gpu_guard  # noqa: E402

from pipeline.core import (  # noqa: E402
    cli,
    run_folders,
)

SCHEMA = "urn:iteragpu-lab:schema:context-room:v1"
# (batch, context, width, dtype): small to about 100 GiB reserved, the three dtypes.
CONFIGURATIONS = [
    (1, 16, 64, "float32"),
    (2, 128, 1024, "float32"),
    (2, 128, 1024, "bfloat16"),
    (2, 128, 1024, "float16"),
    (2, 2097152, 1024, "bfloat16"),
    (2, 128, 16384, "bfloat16"),
    (8192, 128, 1024, "float32"),
]
CHILD = """
import json, sys
sys.path.insert(0, {root!r})
import torch
from kit import mesure_memoire as mm
index = {index}
device = torch.device("cuda", index)
torch.cuda.set_device(device)
torch.cuda.init()
free, total = torch.cuda.mem_get_info(index)
start = total - free
dtype = getattr(torch, {dtype!r})
model = mm.build_model(torch, {width}, dtype, 0, device)
x = mm.make_input(torch, ({batch}, {context}, {width}), dtype, 0, device)
for _ in range(3):
    y = mm.forward_passes(torch, model, x, 1)
torch.cuda.synchronize(device)
free_after, _ = torch.cuda.mem_get_info(index)
reserved = torch.cuda.memory_reserved(device)
print(json.dumps({{"gpu": torch.cuda.get_device_name(index), "torch": torch.__version__,
    "total_memory_bytes": total, "context_at_start_bytes": start,
    "reserved_bytes": reserved, "outside_allocator_after_bytes": total - free_after - reserved}}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(prog="context_room.py", description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=cli.device, default="cuda:0")
    parser.add_argument("--output-dir", type=Path, default=run_folders.RUNS)

    def body() -> int:
        args = parser.parse_args(argv)
        out = cli.existing_folder(args.output_dir)
        gpu_guard.require_gpu("context_room.py", args.device)
        index = int(args.device.partition(":")[2] or 0)
        points = []
        for batch, context, width, dtype in CONFIGURATIONS:
            code = CHILD.format(
                root=str(ROOT),
                index=index,
                batch=batch,
                context=context,
                width=width,
                dtype=dtype,
            )
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise cli.UsageError(f"{batch}x{context}x{width} {dtype}: {last}")
            point = json.loads(done.stdout)
            point["configuration"] = {
                "batch": batch,
                "context": context,
                "width": width,
                "dtype": dtype,
            }
            point["kernels_loaded_later_bytes"] = (
                point["outside_allocator_after_bytes"] - point["context_at_start_bytes"]
            )
            points.append(point)
            print(
                f"{batch}x{context}x{width} {dtype}: reserved {point['reserved_bytes']:,} B, "
                f"context at start {point['context_at_start_bytes']:,} B, later "
                f"+{point['kernels_loaded_later_bytes']:,} B",
                flush=True,
            )
        document = {
            "schema": SCHEMA,
            "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            "method": CHILD.strip(),
            "points": points,
        }
        folder = run_folders.new_run_folder(out)
        folder = folder.rename(folder.with_name(folder.name + "-context-room"))
        cli.write_new(
            folder / "context-room.json", (json.dumps(document, indent=2) + "\n").encode()
        )
        print(f"{folder / 'context-room.json'}: written")
        return cli.OK

    return cli.run("context_room.py", body)


if __name__ == "__main__":
    raise SystemExit(main())
