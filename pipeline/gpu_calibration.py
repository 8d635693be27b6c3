"""A GPU's calibration that travels: what its kernels allocate, for predictions made elsewhere.

`own_model.py measure` probes each distinct operator call of a trace on the GPU it runs on
(trace_prediction.probe_operators): the blocks the kernel allocates besides its outputs. A
calibration file gathers such probes, made on one GPU with one PyTorch, so that
`own_model.py estimate --gpu NAME` on a machine without that GPU can use them:

- an operator call with the same signature (operator, shapes, strides, arguments) as a probed
  one takes its template, as it would in the process that probed it;
- a matrix product of any shape takes the pattern its probes share: PyTorch hands cuBLAS and
  cuBLASLt fixed workspaces, allocated once per thread and kept, and the kernels allocate
  nothing else through the caching allocator. The pattern is used only where every probe of
  that operator and argument form agreed on it, at least two shapes of them;
- everything else is not covered: the prediction says approximate and gives bounds.

`build` makes the file from a folder of probe documents (what the GPU script wrote, kept as
evidence under runs/); `load` reads it back. The file is named by the GPU, its PyTorch and,
in every prediction that uses it, its SHA-256.

Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

import cli
import trace_prediction

SCHEMA = "iteragpu-lab/gpu-calibration/v1"
FOLDER = Path(__file__).resolve().parent.parent / "calibrations"
# The GPUs `--gpu` knows: name -> (calibration file, what the attention rule needs)
KNOWN = {"h200": "nvidia-h200-torch-2.11.0+cu130.json"}
# Matrix products: cuBLAS/cuBLASLt workspaces only (see the module's docstring).
GENERALISED = frozenset(
    f"aten.{name}.default"
    for name in ("mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "matmul", "mv", "addmv")
)


def form(name: str, leaves: list) -> str:
    """An operator call without its shapes: its name and each argument's kind (a tensor's
    dtype, None, or a value), which decides its kernel's extra blocks for GENERALISED."""
    kinds = []
    for leaf in leaves:
        if isinstance(leaf, tuple) and leaf and leaf[0] == "tensor":
            kinds.append(leaf[1])
        elif leaf is None:
            kinds.append("None")
        else:
            kinds.append("value")
    return f"{name}({', '.join(kinds)})"


def abstract(template: list) -> list:
    """A template with its outputs' sizes left out (a pattern's outputs are the call's own)."""
    return [dict(step, bytes=None) if step["kind"] == "output" else dict(step) for step in template]


def build(documents: list[dict]) -> dict:
    """The calibration file's content from probe documents (one per traced workload)."""
    signatures: dict = {}
    output_only: set = set()
    forms: dict = {}  # form -> {json of abstract template: set of signatures}
    per_thread = set()
    for document in documents:
        leaves = {  # only matrix products' (other calls' may hold inf or nan)
            key: ast.literal_eval(entry["leaves"])
            for key, entry in document["signatures"].items()
            if entry["name"] in GENERALISED
        }
        names = {key: entry["name"] for key, entry in document["signatures"].items()}
        section = document["calibration"]
        per_thread.add(section["workspaces_per_thread"])
        for entry in section["operators"]:
            signatures[entry["signature"]] = {"op": entry["op"], "template": entry["template"]}
        output_only.update(section["output_only"])
        for key, name in names.items():
            if name not in GENERALISED:
                continue
            template = next(
                (e["template"] for e in section["operators"] if e["signature"] == key), None
            )
            if template is None and key in section["output_only"]:
                template = [{"kind": "output", "index": 0, "bytes": None}]
            if template is None:
                continue
            text = json.dumps(abstract(template), sort_keys=True)
            forms.setdefault(form(name, leaves[key]), {}).setdefault(text, set()).add(key)
    patterns = {
        key: json.loads(next(iter(found)))
        for key, found in sorted(forms.items())
        if len(found) == 1 and len(next(iter(found.values()))) >= 2
    }
    varies = sorted(key for key, found in forms.items() if len(found) > 1)
    return {
        "schema": SCHEMA,
        "workspaces_per_thread": per_thread.pop() if len(per_thread) == 1 else None,
        "patterns": patterns,
        "patterns_not_shared": varies,
        "signatures": dict(sorted(signatures.items())),
        "output_only": sorted(output_only - set(signatures)),
    }


def load(name: str) -> tuple[trace_prediction.Calibration, dict]:
    """(calibration, the file's GPU facts) for `--gpu NAME`."""
    path = FOLDER / KNOWN[name]
    data = path.read_bytes()
    document = json.loads(data)
    calibration = trace_prediction.Calibration(
        templates={
            key: [trace_prediction.template_step(step) for step in entry["template"]]
            for key, entry in document["signatures"].items()
        },
        output_only=set(document["output_only"]),
        workspaces_per_thread=document["workspaces_per_thread"],
        patterns={
            key: [trace_prediction.template_step(step) for step in template]
            for key, template in document["patterns"].items()
        },
        source=(
            f"{path.name} (sha256 {hashlib.sha256(data).hexdigest()[:16]}; "
            f"{document['gpu']['name']}, torch {document['torch']})"
        ),
    )
    return calibration, document


def main(argv: list[str] | None = None) -> int:
    return cli.run("gpu_calibration.py", lambda: build_command(argv))


def build_command(argv: list[str] | None) -> int:
    """build PROBES_FOLDER --output FILE --made-from FOLDER: the GPU's name, capability,
    PyTorch and cuDNN come from the machine.txt beside the probes."""
    parser = cli.Parser(prog="gpu_calibration.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=cli.Parser)
    make = commands.add_parser("build", help="a calibration file from a folder of probes")
    make.add_argument("probes", help="a folder of probe documents (*.json)")
    make.add_argument("--output", required=True, help="a new JSON file")
    make.add_argument("--made-from", required=True, help="the evidence folder, as cited")
    args = parser.parse_args(argv)
    folder = Path(args.probes)
    files = sorted(folder.glob("*.json"))
    if not files:
        raise cli.UsageError(f"{folder}: no probe documents (*.json)")
    documents = [json.loads(path.read_text()) for path in files]
    machine = (folder.parent / "machine.txt").read_text().splitlines()
    gpu_name = machine[1].split(",")[0].strip()
    torch_version, cudnn = machine[2].split()[1:3]
    capability = [int(x) for x in machine[2].split("(")[-1].rstrip(")").split(",")]
    content = {
        "schema": SCHEMA,
        "gpu": {"name": gpu_name, "capability": capability},
        "torch": torch_version,
        "cudnn": int(cudnn),
        "made_from": f"{args.made_from}: {len(files)} traced workloads, probed on the GPU",
        **{k: v for k, v in build(documents).items() if k != "schema"},
    }
    cli.write_new(Path(args.output), (json.dumps(content, indent=1) + "\n").encode())
    print(
        f"{args.output}: {len(content['signatures'])} probed calls, "
        f"{len(content['patterns'])} patterns"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
