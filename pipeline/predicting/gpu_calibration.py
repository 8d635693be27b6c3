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
- any other operator whose probes agree at SHAPE_RULE_MIN distinct shapes or more, every
  probe allocating the same blocks besides its outputs, takes that template for a call of the
  same `rule_key` (operator, each tensor's dtype and layout, every other argument's value)
  whose tensors' sizes lie, dimension by dimension, within those probed (its domain): the
  probes show its kernels' scratch does not depend on the shapes there, and nothing is
  claimed outside. Operators whose scratch depends on values are never generalised;
- an operator whose kernel's scratch grows with the shapes (the attention backward kernels)
  takes the sizes of a formula (kernel_formulas.py) where the formula matched every probe
  of that form, SHAPE_RULE_MIN shapes or more, each block's size and the order of the steps,
  and the call's sizes lie within those probed: a formula rule;
- a reduction (sum, mean, amax, argmax...) takes the blocks PyTorch's reduction kernel
  allocates on that GPU by the kernel's own arithmetic (reduce_scratch.py), probed or not;
- everything else is not covered: the prediction says approximate and gives bounds.

`build` makes the file from a folder of probe documents (what the GPU script wrote, kept as
evidence under runs/); `load` reads it back. The file is named by the GPU, its PyTorch and,
in every prediction that uses it, its SHA-256.

Standard library, and jsonschema where a file is checked.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

from pipeline.core import cli, places
from pipeline.core.call_keys import form, layout, rule_key, sizes, within  # noqa: F401 (gc.form... stay)
from pipeline.predicting import attention_choice, kernel_formulas, reduce_scratch, trace_prediction

SCHEMA = "iteragpu-lab/gpu-calibration/v1"
FOLDER = places.folder("calibrations")
SCHEMA_FILE = places.folder("schemas") / "gpu-calibration.schema.json"
# The collections a file's top level holds: checked entry by entry only where the whole file
# is (`check(..., whole=True)`: about 3 s for the H200's 30,000 probed calls, with jsonschema)
COLLECTIONS = {
    "patterns": "object",
    "shape_rules": "object",
    "formula_rules": "object",
    "signatures": "object",
    "output_only": "array",
}
# The GPUs `--gpu` knows: name -> (calibration file, what the attention rule needs)
KNOWN = {"h200": "nvidia-h200-torch-2.11.0+cu130.json"}
# Matrix products: cuBLAS/cuBLASLt workspaces only (see the module's docstring).
GENERALISED = frozenset(
    f"aten.{name}.default"
    for name in ("mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "matmul", "mv", "addmv")
)


SHAPE_RULE_MIN = 3
# Reductions and scans switch scratch on at sizes inside any box of probed ones (a reduction
# splits one output's inputs across thread blocks past a size that depends on the others):
# never by shape. trace.operators.reduction_without_scratch covers those PyTorch's source
# settles.
NOT_BY_SHAPE = frozenset(
    f"aten.{name}"
    for name in ("sum", "mean", "amax", "amin", "argmax", "argmin", "max", "min", "prod", "var",
                 "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "cumsum",
                 "cumprod", "logsumexp", "all", "any", "nansum", "count_nonzero",
                 "_safe_softmax")
)  # fmt: skip


class _Floats(ast.NodeTransformer):
    def visit_Name(self, node):
        if node.id in ("inf", "nan"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def leaves_of(text: str) -> list:
    """A probe document's `leaves` (a Python repr, where a float may be inf or nan)."""
    return ast.literal_eval(_Floats().visit(ast.parse(text, mode="eval")))


def abstract(template: list) -> list:
    """A template with its outputs' sizes left out (a pattern's outputs are the call's own)."""
    return [dict(step, bytes=None) if step["kind"] == "output" else dict(step) for step in template]


def domain(shapes: list) -> list:
    """[least, most] of each device tensor's sizes, dimension by dimension, over the probes."""
    per_tensor = list(zip(*shapes, strict=True))
    return [
        [[min(dims) for dims in zip(*each, strict=True)] for each in per_tensor],
        [[max(dims) for dims in zip(*each, strict=True)] for each in per_tensor],
    ]


def structure(template: list) -> list:
    """A template with every size left out: a formula rule's steps, filled per call."""
    return [dict(step, bytes=None) if "bytes" in step else dict(step) for step in template]


def formula_rules(found: dict) -> tuple[dict, list]:
    """(rules, keys where the formula missed a probe) from {key: [(structure, matched,
    sizes)]}: a rule where every probe of the key matched, with one structure for each
    number of blocks the formula gives (a kernel may take a workspace or not)."""
    accepted, missed = {}, []
    for key, probes in sorted(found.items()):
        if not all(matched for _, matched, _ in probes):
            missed.append(key)
            continue
        shapes = {json.dumps(probed): probed for _, _, probed in probes}
        structures: dict = {}
        for steps, _, _ in probes:
            blocks = str(sum(step["kind"] == "internal" for step in steps))
            structures.setdefault(blocks, set()).add(json.dumps(steps, sort_keys=True))
        if any(len(texts) != 1 for texts in structures.values()):
            continue
        if len(shapes) < SHAPE_RULE_MIN:
            continue
        accepted[key] = {
            "formula": kernel_formulas.FORMULAS[key.split("(")[0]].__name__,
            "templates": {n: json.loads(texts.pop()) for n, texts in sorted(structures.items())},
            "domain": domain(list(shapes.values())),
            "shapes": len(shapes),
        }
    return accepted, missed


def shape_rules(rules: dict) -> dict:
    """The rules whose probes all allocated the same blocks, at SHAPE_RULE_MIN shapes or more:
    their template, their domain, how many shapes."""
    found_rules = {}
    for key, found in sorted(rules.items()):
        if len(found) != 1:
            continue
        ((text, probed),) = found.items()
        shapes = list(probed.values())
        if len(shapes) < SHAPE_RULE_MIN:
            continue
        found_rules[key] = {
            "template": json.loads(text),
            "domain": domain(shapes),
            "shapes": len(shapes),
        }
    return found_rules


def build(documents: list[dict]) -> dict:
    """The calibration file's content from probe documents (one per traced workload)."""
    signatures: dict = {}
    output_only: set = set()
    rules: dict = {}  # rule_key -> {json of abstract template: [sizes of each probe]}
    formulas: dict = {}  # formula key -> [(structure, formula matched, sizes)]
    forms: dict = {}  # form -> {json of abstract template: set of signatures}
    per_thread = set()
    for document in documents:
        leaves = {key: leaves_of(entry["leaves"]) for key, entry in document["signatures"].items()}
        names = {key: entry["name"] for key, entry in document["signatures"].items()}
        section = document["calibration"]
        per_thread.add(section["workspaces_per_thread"])
        for entry in section["operators"]:
            signatures[entry["signature"]] = {"op": entry["op"], "template": entry["template"]}
        output_only.update(section["output_only"])
        templates = {entry["signature"]: entry["template"] for entry in section["operators"]}
        for key, entry in document["signatures"].items():
            name = entry["name"]
            packet = trace_prediction.packet(name)
            formula = kernel_formulas.internal_sizes(name, leaves[key])
            if formula is not None and key in templates:  # None: a call it does not speak for
                steps = templates[key]
                internal = [step["bytes"] for step in steps if step["kind"] == "internal"]
                formulas.setdefault(rule_key(name, leaves[key], integers=False), []).append(
                    (structure(steps), formula == internal, sizes(leaves[key]))
                )
            if name in GENERALISED or packet in trace_prediction.VALUE_DEPENDENT:
                continue
            if packet in NOT_BY_SHAPE:
                continue
            template = templates.get(key)
            if template is None and key in section["output_only"]:
                template = []
            if template is None:
                continue
            call, probed = leaves[key], sizes(leaves[key])
            text = json.dumps(abstract(template), sort_keys=True)
            found = rules.setdefault(rule_key(name, call), {}).setdefault(text, {})
            found.setdefault(json.dumps(probed), probed)
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
    by_formula, formula_missed = formula_rules(formulas)
    return {
        "schema": SCHEMA,
        "workspaces_per_thread": per_thread.pop() if len(per_thread) == 1 else None,
        "patterns": patterns,
        "patterns_not_shared": varies,
        "shape_rules": shape_rules(rules),
        "shape_rules_not_shared": sorted(key for key, found in rules.items() if len(found) > 1),
        "formula_rules": by_formula,
        "formula_rules_missed": formula_missed,
        "signatures": dict(sorted(signatures.items())),
        "output_only": sorted(output_only - set(signatures)),
    }


def read_formula_rules(rules: dict) -> dict:
    """A file's formula rules as trace_prediction.Calibration holds them."""
    return {
        key: (
            {
                int(blocks): [trace_prediction.template_step(step) for step in template]
                for blocks, template in rule["templates"].items()
            },
            rule["domain"],
        )
        for key, rule in rules.items()
    }


def check(document, path: Path, whole: bool = False) -> None:
    """The document against schemas/gpu-calibration.schema.json, else one line. `whole`:
    every entry too (what `build` writes); else the top level, each collection's type only
    (what every `--gpu` estimate reads: milliseconds; the tests check each committed file
    whole)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    schema = json.loads(SCHEMA_FILE.read_text())
    if not whole:
        for key, kind in COLLECTIONS.items():
            schema["properties"][key] = {"type": kind}
    error = best_match(Draft202012Validator(schema).iter_errors(document))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the top level"
        raise cli.UsageError(
            f"{path}: not a GPU calibration ({SCHEMA}): at {where}: "
            f"{' '.join(error.message.split())[:160]}"
        )


def load(name: str) -> tuple[trace_prediction.Calibration, dict]:
    """(calibration, the file's GPU facts) for `--gpu NAME`, the file checked (`check`)."""
    path = FOLDER / KNOWN[name]
    data = path.read_bytes()
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise cli.UsageError(f"{path}: not JSON ({exc})") from None
    check(document, path)
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
        shape_rules={
            key: (
                [trace_prediction.template_step(step) for step in rule["template"]],
                rule["domain"],
            )
            for key, rule in document.get("shape_rules", {}).items()
        },
        formula_rules=read_formula_rules(document.get("formula_rules", {})),
        reduce_device=reduce_scratch.DEVICES.get(document["gpu"]["name"]),
        source=(
            f"{path.name} (sha256 {hashlib.sha256(data).hexdigest()[:16]}; "
            f"{document['gpu']['name']}, torch {document['torch']})"
        ),
    )
    return calibration, document


def target(facts: dict) -> attention_choice.TargetGpu:
    """The GPU a calibration file was measured on, as the target a trace without it takes:
    its kernel choices are that GPU's."""
    gpu = facts["gpu"]
    return attention_choice.TargetGpu(gpu["name"], tuple(gpu["capability"]), facts["torch"])


def name_for(gpu_name: str | None, torch_version: str | None) -> str | None:
    """The `--gpu` name of the committed calibration measured on this GPU model with this
    PyTorch, or None: another GPU's or PyTorch's kernels allocate other blocks."""
    for name, file in sorted(KNOWN.items()):
        facts = json.loads((FOLDER / file).read_bytes())
        if (facts["gpu"]["name"], facts["torch"]) == (gpu_name, torch_version):
            return name
    return None


def main(argv: list[str] | None = None) -> int:
    return cli.run("gpu_calibration.py", lambda: build_command(argv))


def build_command(argv: list[str] | None) -> int:
    """build EVIDENCE_FOLDER... --output FILE: each folder (under runs/) holds probes/*.json
    and the machine.txt its GPU script wrote, which gives the GPU's name, capability, PyTorch
    and cuDNN; the folders must agree on them."""
    parser = cli.Parser(prog="gpu_calibration.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=cli.Parser)
    make = commands.add_parser("build", help="a calibration file from folders of probes")
    make.add_argument("evidence", nargs="+", help="folders holding probes/*.json and machine.txt")
    make.add_argument("--output", required=True, help="a new JSON file")
    args = parser.parse_args(argv)
    output = Path(args.output)
    if output.exists():
        raise cli.UsageError(f"{output}: file exists (a calibration is never overwritten)")
    documents, machines = [], set()
    for folder in map(Path, args.evidence):
        files = sorted((folder / "probes").glob("*.json"))
        if not files:
            raise cli.UsageError(f"{folder / 'probes'}: no probe documents (*.json)")
        documents += [json.loads(path.read_text()) for path in files]
        machine = (folder / "machine.txt").read_text().splitlines()
        torch_version, cudnn = machine[2].split()[1:3]
        capability = tuple(int(x) for x in machine[2].split("(")[-1].rstrip(")").split(","))
        machines.add((machine[1].split(",")[0].strip(), capability, torch_version, int(cudnn)))
    if len(machines) != 1:
        raise cli.UsageError(f"the folders were probed on different machines: {sorted(machines)}")
    ((gpu_name, capability, torch_version, cudnn),) = machines
    cited = ", ".join(f"runs/{Path(folder).resolve().name}" for folder in args.evidence)
    content = {
        "schema": SCHEMA,
        "gpu": {"name": gpu_name, "capability": list(capability)},
        "torch": torch_version,
        "cudnn": cudnn,
        "made_from": f"{cited}: {len(documents)} traced workloads, probed on the GPU",
        **{k: v for k, v in build(documents).items() if k != "schema"},
    }
    check(content, output, whole=True)  # nothing written otherwise
    try:
        cli.write_new(output, (json.dumps(content, indent=1) + "\n").encode())
    except FileExistsError:
        raise cli.UsageError(f"{output} appeared meanwhile: it was left untouched") from None
    print(
        f"{args.output}: {len(content['signatures'])} probed calls, "
        f"{len(content['patterns'])} patterns, {len(content['shape_rules'])} shape rules, "
        f"{len(content['formula_rules'])} formula rules"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
