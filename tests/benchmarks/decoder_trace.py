"""Every allocation and free of the decoder on a real GPU, beside the predictor's, to calibrate.

    python3 tests/benchmarks/decoder_trace.py --device cuda:0 --output-dir DIR \
        [--calibration FILE] [--only NAME]

For each small configuration and dtype (bfloat16, float16, float32), a fresh process runs
the phases exactly as `decoder.py measure` does (mesure_memoire.run_phase, the same model
code) under torch.cuda.memory._record_memory_history(context="all", stacks="python"), and
writes DIR/<dtype>-<name>.json:

  gpu_events     [action, bytes, decoder_model line] for every alloc and free_requested
  mirror_events  the same for decoder.Mirror's replay (with --calibration's blocks, if given)
  extra_blocks   GPU allocations the mirror does not make, each with the operator call it sits
                 in (site, terms), whether it came before the operator's output, when it was
                 freed (before the output, when the operator returned, never), and its frame
  missing        mirror allocations the GPU never made (a mirror bug: fix decoder.Mirror)
  first_mismatch the first step where the two sequences differ, with both sides around it
  rows           the measured counters per phase beside the predicted ones

Then DIR/summary.json and DIR/calibration-proposal.json: the extra blocks grouped by site,
order and lifetime, with the simplest formula of the call's terms that fits every size seen
(an integer, or an integer times up to three terms), which calls had them (`when`), and
whether only the first call did (`once`). The proposal is a decoder calibration document:
review it, commit it as runs/<id>/decoder-calibration.json, and run this again with
--calibration: every configuration should then print "exact". Not a test: needs a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import linecache
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "pipeline"))
import decoder  # noqa: E402

BLOCK = 512  # the GPU trace is compared in allocator blocks
DTYPES = ("bfloat16", "float16", "float32")
# name: (shape, batch, prompt, new tokens). Small, but chosen so that every kernel path a
# larger run takes appears: GQA 1/3/4/8, a 1-token prompt, a large vocabulary (argmax over
# 128256), a long prompt (flash's split-KV heuristics in decode), biases, a tied head.
CONFIGURATIONS = {
    "gqa4-b2-p33": (decoder.Shape(2, 256, 8, 2, 32, 512, 1000), 2, 33, 4),
    "mha-bias-tied-b1-p16": (decoder.Shape(1, 256, 4, 4, 64, 512, 512, True, True), 1, 16, 3),
    "gqa8-b3-p1": (decoder.Shape(1, 512, 8, 1, 64, 1000, 32000), 3, 1, 4),
    "gqa3-w384-b1-p100": (decoder.Shape(2, 384, 6, 2, 64, 1000, 50000), 1, 100, 3),
    "gqa4-v128256-b4-p300": (decoder.Shape(1, 512, 8, 2, 64, 1024, 128256), 4, 300, 3),
}
FIT_TERMS = (
    "batch", "rows", "features", "query_length", "key_length", "heads", "kv_heads",
    "head_dim", "groups", "vocab", "width", "ffn", "dtype_bytes", "positions",
)  # fmt: skip


def run_of(name: str, dtype: str) -> tuple[decoder.Shape, dict]:
    shape, batch, prompt, new = CONFIGURATIONS[name]
    run = dict(decoder.RUN_DEFAULTS, batch=batch, prompt=prompt, new_tokens=new, dtype=dtype)
    return shape, run


# ---------------------------------------------------------------- the child (on the GPU)


def frame_of(frames: list[dict]) -> str:
    """The innermost decoder_model.py line (function:line source), else the innermost frame."""
    for frame in frames:
        if frame["filename"].endswith("decoder_model.py"):
            source = linecache.getline(frame["filename"], frame["line"]).strip()
            return f"{frame['name']}:{frame['line']} {source}"
    if frames:
        return f"{Path(frames[0]['filename']).name}:{frames[0]['line']} {frames[0]['name']}"
    return "no Python frame"


def child(name: str, dtype: str, device_text: str, output: Path, calibration) -> None:
    import mesure_memoire
    import torch

    shape, run = run_of(name, dtype)
    index = mesure_memoire.device_index(device_text)
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=2_000_000
    )
    rows: list[dict] = []
    state = decoder.measure_rows(torch, shape, run, 0, device, rows)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    import decoder_model

    with torch.inference_mode():
        backends = decoder_model.attention_backends(shape, state, run["batch"])
    events, ident, live = [], 0, {}
    for entry in snapshot["device_traces"][index]:
        if entry["action"] == "alloc":
            ident += 1
            live[entry["addr"]] = ident
            events.append(["alloc", ident, entry["size"], frame_of(entry.get("frames", []))])
        elif entry["action"] == "free_requested" and entry["addr"] in live:
            freed = live.pop(entry["addr"])
            events.append(["free", freed, entry["size"], frame_of(entry.get("frames", []))])
    result = {
        "configuration": {"name": name, "shape": shape.__dict__, **run},
        "gpu": torch.cuda.get_device_name(index),
        "multiprocessors": torch.cuda.get_device_properties(index).multi_processor_count,
        "torch": torch.__version__,
        "measured_attention_backend": backends,
        "measured_rows": rows,
        "gpu_events": events,
    }
    output.write_text(json.dumps(result))


# ---------------------------------------------------------------- the comparison


def rounded(nbytes: int) -> int:
    return max(BLOCK, -(-nbytes // BLOCK) * BLOCK)


def align(gpu: list, mirror: list) -> tuple[dict, list]:
    """Walk the GPU's events against the mirror's: an allocation of the size the mirror makes
    next is the same tensor; any other is the kernels' own (extra), and so is its free. A GPU
    free matches the mirror's if the mirror frees that tensor in its current run of frees.
    Returns {GPU position: mirror event} for the matched allocations and the mirror
    allocations the GPU never made."""
    j, matched, by_ident, consumed = 0, {}, {}, set()
    for position, (action, ident, size, _) in enumerate(gpu):
        while j < len(mirror) and j in consumed:
            j += 1
        if action == "alloc":
            if (
                j < len(mirror)
                and mirror[j][0] == "alloc"
                and rounded(mirror[j][2]) == rounded(size)
            ):
                matched[position] = by_ident[ident] = mirror[j]
                j += 1
            continue
        wanted = by_ident.get(ident)
        k = j
        while wanted is not None and k < len(mirror) and (mirror[k][0] == "free" or k in consumed):
            if k not in consumed and mirror[k][0] == "free" and mirror[k][1] == wanted[1]:
                consumed.add(k)
                break
            k += 1
    while j < len(mirror) and j in consumed:
        j += 1
    return matched, [event for event in mirror[j:] if event[0] == "alloc"]


def extra_blocks(gpu: list, matched: dict, call_terms: dict) -> list[dict]:
    """Each GPU allocation the mirror does not make, placed in the operator call it belongs
    to: the next matched output if it was made by the same model line (so it came before
    that output), else the previous one (after it). Its lifetime: never freed, freed before
    that output was allocated, or when the operator returned."""
    outputs = sorted(matched)
    freed_at = {event[1]: i for i, event in enumerate(gpu) if event[0] == "free"}
    blocks = []
    for position, (action, ident, size, frame) in enumerate(gpu):
        if action != "alloc" or position in matched:
            continue
        before = [p for p in outputs if p < position]
        after = [p for p in outputs if p > position]
        following = after[0] if after else None
        previous = before[-1] if before else None
        line = frame.split(" ", 1)[0]
        if following is not None and gpu[following][3].split(" ", 1)[0] == line:
            order, output = "before_output", following
        else:
            order, output = "after_output", previous
        if ident not in freed_at:
            freed = "never"
        elif order == "before_output" and freed_at[ident] < following:
            freed = "before_output"
        else:
            freed = "on_return"
        call = None
        if output is not None:
            event = matched[output]
            call = {"site": event[3], "terms": call_terms.get(event[1], {})}
        blocks.append({"bytes": size, "order": order, "freed": freed, "frame": frame, "call": call})
    return blocks


def compare(result: dict, calibration) -> dict:
    shape = decoder.Shape(**result["configuration"]["shape"])
    run = {k: result["configuration"][k] for k in decoder.RUN_DEFAULTS}
    rows, mirror = decoder.predict(shape, run, calibration)
    mirror_events = [list(e) for e in mirror.events if e[0] != "phase"]
    gpu_events = result["gpu_events"]
    left = decoder.comparable(gpu_events, BLOCK)
    right = decoder.comparable(mirror_events, BLOCK)
    at = decoder.first_mismatch(left, right)
    matched, missing = align(gpu_events, mirror_events)
    counters = {}
    for measured, predicted in zip(result["measured_rows"], rows, strict=False):
        name = measured["phase"] + str(measured.get("repetition", ""))
        for key in decoder.COUNTER_KEYS:
            if measured[key] != predicted[key]:
                counters[f"{name}.{key}"] = measured[key] - predicted[key]
    mismatch = None
    if at is not None:
        mismatch = {
            "step": at,
            "gpu": left[max(0, at - 4) : at + 6],
            "mirror": right[max(0, at - 4) : at + 6],
        }
    return {
        "exact": at is None and not counters,
        "backends": {"measured": result["measured_attention_backend"], "mirror": mirror.backends},
        "mirror_events": mirror_events,
        "extra_blocks": extra_blocks(gpu_events, matched, mirror.call_terms),
        "missing": missing,
        "first_mismatch": mismatch,
        "counter_differences": counters,
        "not_predicted": mirror.not_predicted,
    }


# ---------------------------------------------------------------- the proposal


def fit(samples: list[tuple[dict, int]]) -> list:
    """Formulas that give every size seen: an integer, else an integer times up to three
    terms, fewest terms first. Empty when nothing simple fits."""
    sizes = {size for _, size in samples}
    if len(sizes) == 1:
        return [sizes.pop()]
    found = []
    names = [t for t in FIT_TERMS if all(isinstance(terms.get(t), int) for terms, _ in samples)]
    for count in (1, 2, 3):
        for chosen in itertools.combinations(names, count):
            coefficients = set()
            for terms, size in samples:
                product = math.prod(terms[t] for t in chosen)
                if product == 0 or size % product:
                    break
                coefficients.add(size // product)
            else:
                if len(coefficients) == 1:
                    found.append({"product": [coefficients.pop(), *chosen]})
        if found:
            return found
    return []


def propose(results: dict[str, dict], comparisons: dict[str, dict]) -> tuple[dict, list]:
    groups: dict[tuple, list] = defaultdict(list)
    for key, comparison in comparisons.items():
        for block in comparison["extra_blocks"]:
            site = block["call"]["site"] if block["call"] else "no operator"
            identity = (site, block["frame"].split(" ", 1)[0], block["order"], block["freed"])
            groups[identity].append((key, block))
    sites, report = [], []
    for (site, frame, order, freed), members in sorted(groups.items()):
        samples = [(b["call"]["terms"] if b["call"] else {}, b["bytes"]) for _, b in members]
        formulas = fit(samples)
        lengths = {terms.get("query_length") for terms, _ in samples}
        when = {}
        if lengths == {1}:
            when["query_length"] = 1
        elif 1 not in lengths and None not in lengths:
            when["causal"] = 1
        dtypes = sorted({terms.get("dtype") for terms, _ in samples if terms.get("dtype")})
        if dtypes and dtypes != sorted(DTYPES):
            when["dtype"] = dtypes
        per_process = defaultdict(int)
        for key, _ in members:
            per_process[key] += 1
        once = freed == "never" and set(per_process.values()) == {1}
        if not formulas:
            fitted = f"no simple formula fits: sizes {sorted({size for _, size in samples})}"
        elif len(formulas) > 1:
            fitted = f"other formulas that fit: {formulas[1:]}"
        else:
            fitted = "one formula fits"
        entry = {
            "site": site,
            "when": when,
            "blocks": [
                {
                    "name": frame,
                    "bytes": formulas[0] if formulas else max(size for _, size in samples),
                    "order": order,
                    "freed": freed,
                    "once": once,
                    "note": f"seen {len(members)} times in {len(per_process)} runs; {fitted}",
                }
            ],
        }
        sites.append(entry)
        report.append(
            f"{site:<18} {order:<13} freed {freed:<13} once={once!s:<5} "
            f"{json.dumps(entry['blocks'][0]['bytes'])}  when {json.dumps(when)}  [{frame}]"
        )
    first = next(iter(results.values()))
    proposal = {
        "schema": decoder.CALIBRATION_SCHEMA,
        "gpu": {"name": first["gpu"], "multiprocessors": first["multiprocessors"]},
        "torch": first["torch"],
        "source": "tests/benchmarks/decoder_trace.py: the kernels' own blocks, fitted; review "
        "before committing",
        "attention_backends": [
            {"when": {"dtype": [dtype]}, "backend": backend}
            for dtype, backend in sorted(
                {
                    (r["configuration"]["dtype"], r["measured_attention_backend"].get("prefill"))
                    for r in results.values()
                    if r["measured_attention_backend"].get("prefill")
                }
            )
        ],
        "sites": sites,
    }
    return proposal, report


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--output-dir", type=Path, help="a new folder (required)")
    parser.add_argument("--calibration", type=Path)
    parser.add_argument("--only", choices=sorted(CONFIGURATIONS))
    parser.add_argument(
        "--child", nargs=3, metavar=("NAME", "DTYPE", "FILE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    calibration = decoder.Calibration.load(args.calibration) if args.calibration else None
    if args.child:
        child(args.child[0], args.child[1], args.device, Path(args.child[2]), calibration)
        return 0
    if args.output_dir is None:
        parser.error("the following arguments are required: --output-dir")
    args.output_dir.mkdir(parents=True, exist_ok=False)
    names = [args.only] if args.only else list(CONFIGURATIONS)
    results, comparisons, summary = {}, {}, {}
    for dtype, name in itertools.product(DTYPES, names):
        key = f"{dtype}-{name}"
        raw = args.output_dir / f"{key}.gpu.json"
        command = [sys.executable, __file__, "--device", args.device, "--child", name, dtype]
        done = subprocess.run([*command, str(raw)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{key}: the child failed: {done.stderr.strip().splitlines()[-1:]}")
            summary[key] = {"error": done.stderr[-2000:]}
            continue
        results[key] = json.loads(raw.read_text())
        comparisons[key] = compare(results[key], calibration)
        c = comparisons[key]
        (args.output_dir / f"{key}.json").write_text(
            json.dumps({**results[key], **c}, indent=1) + "\n"
        )
        raw.unlink()
        summary[key] = {
            "exact": c["exact"],
            "extra_blocks": len(c["extra_blocks"]),
            "missing": len(c["missing"]),
            "first_mismatch_step": c["first_mismatch"]["step"] if c["first_mismatch"] else None,
            "counter_differences": c["counter_differences"],
            "backends": c["backends"],
        }
        state = "exact" if c["exact"] else (
            f"{len(c['extra_blocks'])} kernel blocks not predicted, {len(c['missing'])} "
            f"mirror blocks the GPU never made, {len(c['counter_differences'])} counters differ"
        )  # fmt: skip
        print(f"{key:<34} {state}")
        if c["missing"]:
            print(
                f"  the mirror makes what the GPU does not: {c['missing'][:3]} (fix decoder.Mirror)"
            )
        if c["backends"]["measured"] != c["backends"]["mirror"]:
            print(f"  attention: GPU {c['backends']['measured']}, mirror {c['backends']['mirror']}")
    proposal, report = propose(results, comparisons) if results else ({}, [])
    (args.output_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if proposal.get("sites"):
        path = args.output_dir / "calibration-proposal.json"
        path.write_text(json.dumps(proposal, indent=2) + "\n")
        print("kernel blocks by site (site, order, lifetime, once, formula, when, model line):")
        print("\n".join(f"  {line}" for line in report))
        print(f"proposal: {path}")
    return 0 if all(s.get("exact") for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
