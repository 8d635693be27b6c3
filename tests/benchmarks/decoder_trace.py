"""Every allocation and free of the decoder on a real GPU, beside the predictor's, to calibrate.

    python3 tests/benchmarks/decoder_trace.py --device cuda:0 --output-dir DIR \
        [--calibration FILE] [--only NAME,...] [--dtypes D,...]

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
import hashlib
import itertools
import json
import linecache
import math
import subprocess
import sys
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root
import gpu_guard  # noqa: E402

from pipeline.measuring import decoder  # noqa: E402

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
    # Long keys with few (batch x heads) rows: the decode kernel may split the keys and keep
    # partial results in a workspace. The first two are decoder_grid points.
    "gqa4-w4096-b1-p2048": (decoder.Shape(1, 4096, 32, 8, 128, 14336, 128256), 1, 2048, 4),
    "mha-w1024-b2-p4096": (decoder.Shape(2, 1024, 8, 8, 128, 4096, 32768), 2, 4096, 4),
    "gqa4-w1024-b1-p3000": (decoder.Shape(1, 1024, 16, 4, 64, 2048, 1000), 1, 3000, 6),
    "gqa2-w2048-b4-p2500": (decoder.Shape(1, 2048, 16, 8, 128, 4096, 1000), 4, 2500, 6),
    "mqa-w512-b1-p1500": (decoder.Shape(1, 512, 4, 1, 128, 1024, 1000), 1, 1500, 8),
    "gqa4-w4096-b4-p2048": (decoder.Shape(1, 4096, 32, 8, 128, 4096, 1000), 4, 2048, 4),
    "gqa4-w4096-b5-p2048": (decoder.Shape(1, 4096, 32, 8, 128, 4096, 1000), 5, 2048, 4),
    # float32 points of decoder_grid: one head per key head (mha) and grouped (gqa3)
    "mha-w256-b1-p16": (decoder.Shape(1, 256, 4, 4, 64, 512, 1000), 1, 16, 4),
    "gqa3-l2-w384-b1-p100": (decoder.Shape(2, 384, 6, 2, 64, 1000, 50000), 1, 100, 6),
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
    import torch

    from pipeline import mesure_memoire

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
    from pipeline.workloads import decoder_model

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


def outside_model(frame: str) -> bool:
    """A frame that is no decoder_model.py line ("file.py:line function" or none)."""
    return frame == "no Python frame" or frame.split(":", 1)[0].endswith(".py")


def measured_events(gpu: list) -> list:
    """The GPU's events up to the end of the last row: the frees after it, outside the model's
    code, are the process dropping the weights, the cache and the last token (no row holds
    them; the mirror stops where the rows stop)."""
    end = len(gpu)
    while end and gpu[end - 1][0] == "free" and outside_model(gpu[end - 1][3]):
        end -= 1
    return gpu[:end]


def align(gpu: list, mirror: list) -> tuple[dict, list]:
    """Walk the GPU's events against the mirror's: an allocation of exactly the bytes the
    mirror makes next is the same tensor; any other is the kernels' own (extra), and so is
    its free. (Exact bytes, not 512-byte blocks: an 8-byte seed would otherwise pass for a
    512-byte output.) A GPU free matches the mirror's if the mirror frees that tensor in its
    current run of frees. Returns {GPU position: mirror event} for the matched allocations
    and the mirror allocations the GPU never made."""
    j, matched, by_ident, consumed = 0, {}, {}, set()
    for position, (action, ident, size, _) in enumerate(gpu):
        while j < len(mirror) and j in consumed:
            j += 1
        if action == "alloc":
            if j < len(mirror) and mirror[j][0] == "alloc" and mirror[j][2] == size:
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
            call = {"site": event[3], "terms": call_terms.get(event[1], {}), "position": output}
        blocks.append({"bytes": size, "order": order, "freed": freed, "frame": frame, "call": call})
    return blocks


def shape_and_run(result: dict) -> tuple[decoder.Shape, dict]:
    shape = decoder.Shape(**result["configuration"]["shape"])
    return shape, {k: result["configuration"][k] for k in decoder.RUN_DEFAULTS}


def compare(result: dict, calibration) -> dict:
    shape, run = shape_and_run(result)
    rows, mirror = decoder.predict(shape, run, calibration)
    mirror_events = [list(e) for e in mirror.events if e[0] != "phase"]
    gpu_events = measured_events(result["gpu_events"])
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
    calls = [
        {"position": p, "site": matched[p][3], "terms": mirror.call_terms[matched[p][1]]}
        for p in sorted(matched)
        if matched[p][1] in mirror.call_terms
    ]
    return {
        "exact": at is None and not counters,
        "backends": {"measured": result["measured_attention_backend"], "mirror": mirror.backends},
        "mirror_events": mirror_events,
        "extra_blocks": extra_blocks(gpu_events, matched, mirror.call_terms),
        "missing": missing,
        "first_mismatch": mismatch,
        "counter_differences": counters,
        "not_predicted": mirror.not_predicted,
        "calls": calls,  # every operator call, for the proposal (not written)
    }


# ---------------------------------------------------------------- the proposal

# The terms a backend rule or a block's condition may be stated in, the first that separates
# the calls that have it from those that do not wins.
BACKEND_TERMS = ("query_length", "key_length", "causal", "head_dim", "groups", "batch")
CONDITION_TERMS = ("causal", "bias", "query_length", "key_length", "groups", "dtype")
# Runs (batch, prompt, new tokens) of every traced and preset shape: a formula is determined
# when every formula that fits the trace gives the same bytes on all their calls.
PROBE_RUNS = ((5, 7, 3), (2, 1, 2))


def separating(members: list[dict], others: list[dict], names) -> dict | None:
    """The first term whose values over `members` none of `others` has, as a condition."""
    for name in names:
        values = {terms.get(name) for terms in members}
        if None in values or not values.isdisjoint(terms.get(name) for terms in others):
            continue
        ordered = sorted(values, key=str)
        return {name: ordered[0] if len(ordered) == 1 else ordered}
    return None


def attention_calls(key: str, result: dict) -> list[tuple[dict, str, str]]:
    """The calls PyTorch's chooser was asked about (the prefill, the first decode step), with
    the kernel it named: (terms, backend, label)."""
    shape, run = shape_and_run(result)
    mirror, prompt = decoder.Mirror(shape, run), run["prompt"]
    found = []
    for kind, tokens, keys in (("prefill", prompt, prompt), ("decode", 1, prompt + 1)):
        backend = result["measured_attention_backend"].get(kind)
        if backend:
            terms = mirror.terms(**mirror.attention_call(tokens, keys))
            found.append((terms, backend, f"{result['configuration']['name']} {kind}"))
    return found


def infer_backends(results: dict[str, dict]) -> tuple[list[dict], list[str]]:
    """Per dtype, the kernel most calls took, after the exceptions, each stated by the first
    term that tells its calls from the others. Dtypes with the same rule share entries."""
    by_dtype: dict[str, list] = defaultdict(list)
    for key, result in sorted(results.items()):
        for call in attention_calls(key, result):
            by_dtype[call[0]["dtype"]].append(call)
    rules: dict[tuple, list] = defaultdict(list)
    labels: dict[tuple, dict] = defaultdict(lambda: defaultdict(set))  # rule -> kernel -> calls
    problems = []
    for dtype, seen in sorted(by_dtype.items()):
        counts = Counter(backend for _, backend, _ in seen)
        default = max(sorted(counts), key=counts.get)
        exceptions = []
        for backend in sorted(set(counts) - {default}):
            members = [t for t, b, _ in seen if b == backend]
            when = separating(members, [t for t, b, _ in seen if b != backend], BACKEND_TERMS)
            if when is None:
                problems.append(f"{dtype}: no single term tells the {backend} calls apart")
                continue
            exceptions.append((json.dumps(when, sort_keys=True), backend))
        rule = (tuple(exceptions), default)
        rules[rule].append(dtype)
        for _, backend, label in seen:
            labels[rule][backend].add(label)
    entries = []
    for (exceptions, default), dtypes in rules.items():
        for when, backend in exceptions:
            entries.append(
                {
                    "when": {"dtype": dtypes, **json.loads(when)},
                    "backend": backend,
                    "note": "measured: "
                    + ", ".join(sorted(labels[(exceptions, default)][backend])),
                }
            )
        entries.append(
            {
                "when": {"dtype": dtypes},
                "backend": default,
                "note": "measured: " + ", ".join(sorted(labels[(exceptions, default)][default])),
            }
        )
    return entries, problems


def fit(samples: list[tuple[dict, int]], probes: list[dict] = ()) -> tuple[list, bool]:
    """Every formula that gives every size seen: the size itself when it never changes, an
    integer times up to three terms, fewest terms first. Determined when they all give the
    same bytes on every probe call (calls of other runs where the block would be made)."""
    sizes = {size for _, size in samples}
    found: list = [next(iter(sizes))] if len(sizes) == 1 else []
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
    determined = bool(found) and all(
        len({decoder.evaluate(formula, terms, "fit") for formula in found}) == 1 for terms in probes
    )
    return found, determined


def probe_calls(results: dict[str, dict], chooser) -> dict[str, list[dict]]:
    """The operator calls, by site, of every traced and preset shape over PROBE_RUNS."""
    shapes = {json.dumps(r["configuration"]["shape"], sort_keys=True) for r in results.values()}
    shapes = [decoder.Shape(**json.loads(s)) for s in sorted(shapes)]
    shapes += [shape for shape, _ in decoder.PRESETS.values()]
    dtypes = sorted({r["configuration"]["dtype"] for r in results.values()})
    calls: dict[str, list[dict]] = defaultdict(list)
    for shape, dtype, (batch, prompt, new) in itertools.product(shapes, dtypes, PROBE_RUNS):
        run = dict(decoder.RUN_DEFAULTS, batch=batch, prompt=prompt, new_tokens=new, dtype=dtype)
        _, mirror = decoder.predict(shape, run, chooser)
        sites = {e[1]: e[3] for e in mirror.events if e[0] == "alloc"}
        for ident, terms in mirror.call_terms.items():
            calls[sites[ident]].append(terms)
    return calls


def propose(results: dict[str, dict], source: str, derived_from=None) -> tuple[dict, list]:
    """A calibration from traces: the kernel choice (infer_backends), then, replaying with
    it, each operator call's extra blocks by site, kernel, order and rank; for each, its
    formula (fit), the condition that tells the calls that make it from those that do not
    (separating), and whether only the first call does (a library workspace)."""
    first = next(iter(results.values()))
    backends, report = infer_backends(results)
    proposal = {
        "schema": decoder.CALIBRATION_SCHEMA,
        "gpu": {"name": first["gpu"], "multiprocessors": first["multiprocessors"]},
        "torch": first["torch"],
        "source": source,
        **({"derived_from": derived_from} if derived_from else {}),
        "covers": {"dtype": sorted({r["configuration"]["dtype"] for r in results.values()})},
        "attention_backends": backends,
        "sites": [],
    }
    chooser = decoder.Calibration(proposal, "the proposal's kernel choice")
    groups: dict[tuple, list] = defaultdict(list)
    population: dict[tuple, list] = defaultdict(list)
    first_calls: dict[tuple, list] = defaultdict(list)
    for key, result in sorted(results.items()):
        comparison = compare(result, chooser)
        by_call: dict[int, list] = defaultdict(list)
        for block in comparison["extra_blocks"]:
            if block["call"] is None or not block["call"]["terms"]:
                report.append(f"{key}: a {block['bytes']}-byte block no operator call explains")
                continue
            by_call[block["call"]["position"]].append(block)
        for call in comparison["calls"]:
            kind = (call["site"], call["terms"].get("backend"))
            if not population[kind] or population[kind][-1][0] != key:
                first_calls[kind].append(call["terms"])
            population[kind].append((key, call["terms"]))
            blocks = by_call.get(call["position"], [])
            for rank, order in enumerate(("before_output", "after_output")):
                for index, block in enumerate(b for b in blocks if b["order"] == order):
                    groups[(*kind, rank, index)].append((key, call["terms"], block))
    probes = probe_calls(results, chooser)
    entries: dict[tuple, dict] = {}
    for (site, backend, _, index), members in sorted(groups.items(), key=str):
        entry, block = fitted_block(site, backend, index, members, population, first_calls, probes)
        identity = (site, json.dumps(entry["when"], sort_keys=True))
        entries.setdefault(identity, entry)["blocks"].append(block)
        report.append(
            f"{site:<10} {json.dumps(entry['when']):<40} {block['order']:<13} freed "
            f"{block['freed']:<10} once={block['once']!s:<5} exact={block['exact']!s:<5} "
            f"{json.dumps(block['bytes'])}"
        )
    proposal["sites"] = list(entries.values())
    return proposal, report


def fitted_block(site, backend, index, members, population, first_calls, probes):
    """One calibration block (and its entry's condition) from the calls that made it."""
    kind = (site, backend)
    order = members[0][2]["order"]
    freed = Counter(block["freed"] for _, _, block in members).most_common(1)[0][0]
    per_run = Counter(key for key, _, _ in members)
    once = freed == "never" and set(per_run.values()) == {1}
    made = {id(terms) for _, terms, _ in members}
    candidates = first_calls[kind] if once else [terms for _, terms in population[kind]]
    others = [terms for terms in candidates if id(terms) not in made]
    when = {"backend": backend} if backend else {}
    condition = separating([t for _, t, _ in members], others, CONDITION_TERMS) if others else {}
    problems = []
    if condition is None:
        problems.append(f"made by {len(made)} of {len(population[kind])} calls, no single term "
                        "tells which")  # fmt: skip
        condition = {}
    when.update(condition)
    if len({block["freed"] for _, _, block in members}) > 1:
        problems.append("freed at different moments by different calls")
    where = [t for t in probes.get(site, []) if decoder.matches(when, t, "probe")]
    formulas, determined = fit([(t, b["bytes"]) for _, t, b in members], [] if once else where)
    sizes = sorted({b["bytes"] for _, _, b in members})
    if not formulas:
        problems.append(f"no simple formula fits the sizes {sizes}: the largest is written")
    elif not determined:
        problems.append(
            f"{len(formulas)} formulas fit the traced calls and disagree on other runs "
            f"(e.g. {json.dumps(formulas[:4])}): trace more shapes"
        )
    seen = f"seen {len(members)} times in {len(per_run)} runs"
    if once:
        seen += "; made once and kept: a library workspace, its size the library's setting"
    block = {
        "name": f"{backend or site} {order.split('_')[0]} #{index}",
        "bytes": formulas[0] if formulas else sizes[-1],
        "order": order,
        "freed": freed,
        "once": once,
        "exact": not problems,
        "note": "; ".join([seen, *problems]),
    }
    return {"site": site, "when": when, "blocks": []}, block


def recorded_results(trace: Path) -> dict[str, dict]:
    """The per-configuration files of a committed trace (a .tar.gz of this tool's output)."""
    results = {}
    with tarfile.open(trace) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            name = Path(member.name).name
            if member.isfile() and name.endswith(".json") and name != "summary.json":
                document = json.load(archive.extractfile(member))
                if "gpu_events" in document:
                    results[name.removesuffix(".json")] = document
    return results


def derived_from(trace: Path, results: dict) -> dict:
    return {
        "trace": decoder.recorded_path(trace),
        "sha256": hashlib.sha256(trace.read_bytes()).hexdigest(),
        "configurations": sorted(results),
    }


# ---------------------------------------------------------------- main


def report_comparisons(results: dict, calibration, output_dir: Path, write: bool) -> dict:
    summary = {}
    for key, result in results.items():
        c = compare(result, calibration)
        c.pop("calls")
        if write:
            (output_dir / f"{key}.json").write_text(json.dumps({**result, **c}, indent=1) + "\n")
        summary[key] = {
            "exact": c["exact"],
            "extra_blocks": len(c["extra_blocks"]),
            "missing": len(c["missing"]),
            "first_mismatch_step": c["first_mismatch"]["step"] if c["first_mismatch"] else None,
            "counter_differences": c["counter_differences"],
            "backends": c["backends"],
            "not_predicted": c["not_predicted"],
        }
        state = "exact" if c["exact"] else (
            f"{len(c['extra_blocks'])} kernel blocks not predicted, {len(c['missing'])} "
            f"mirror blocks the GPU never made, {len(c['counter_differences'])} counters differ"
        )  # fmt: skip
        if c["exact"] and c["not_predicted"]:
            state += f" (the prediction says inexact: {', '.join(sorted(c['not_predicted']))})"
        print(f"{key:<34} {state}")
        if c["missing"]:
            print(
                f"  the mirror makes what the GPU does not: {c['missing'][:3]} (fix decoder.Mirror)"
            )
        if c["backends"]["measured"] != c["backends"]["mirror"]:
            print(f"  attention: GPU {c['backends']['measured']}, mirror {c['backends']['mirror']}")
    return summary


def names_of(text: str) -> list[str]:
    names = text.split(",")
    if unknown := [n for n in names if n not in CONFIGURATIONS]:
        raise argparse.ArgumentTypeError(f"no configuration named {', '.join(unknown)}")
    return names


def dtypes_of(text: str) -> tuple[str, ...]:
    dtypes = tuple(text.split(","))
    if unknown := [d for d in dtypes if d not in DTYPES]:
        raise argparse.ArgumentTypeError(f"no dtype {', '.join(unknown)} (one of {DTYPES})")
    return dtypes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--output-dir", type=Path, help="a new folder (required)")
    parser.add_argument("--calibration", type=Path)
    parser.add_argument(
        "--only", type=names_of, help=f"comma-separated names among {', '.join(CONFIGURATIONS)}"
    )
    parser.add_argument("--dtypes", type=dtypes_of, default=DTYPES, help="comma-separated")
    parser.add_argument(
        "--from-trace",
        type=Path,
        metavar="TAR_GZ",
        help="refit a committed trace on the CPU (no GPU, no torch): the proposal, then every "
        "configuration compared with it (or with --calibration)",
    )
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
    if not args.from_trace:
        gpu_guard.require_gpu("decoder_trace.py", args.device)
    args.output_dir.mkdir(parents=True, exist_ok=False)
    failures: dict[str, dict] = {}
    if args.from_trace:
        results = recorded_results(args.from_trace)
        trace = decoder.recorded_path(args.from_trace)
        source = (
            f"tests/benchmarks/decoder_trace.py --from-trace {trace}: the kernels' blocks, fitted"
        )
        origin = derived_from(args.from_trace, results)
    else:
        results, failures = run_children(args)
        source = "tests/benchmarks/decoder_trace.py: the kernels' own blocks, fitted"
        origin = None
    proposal, report = propose(results, source, origin) if results else ({}, [])
    if proposal.get("sites"):
        path = args.output_dir / "calibration-proposal.json"
        path.write_text(json.dumps(proposal, indent=2) + "\n")
        print("kernel blocks by site (site, when, order, lifetime, once, exact, formula):")
        print("\n".join(f"  {line}" for line in report))
        print(f"proposal: {path}")
    if args.from_trace and calibration is None and proposal:
        calibration = decoder.Calibration(proposal, "the proposal")
        print("the recorded configurations against the proposal:")
    summary = report_comparisons(results, calibration, args.output_dir, not args.from_trace)
    summary.update(failures)
    (args.output_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary and all(s.get("exact") for s in summary.values()) else 1


def run_children(args) -> tuple[dict[str, dict], dict[str, dict]]:
    """One fresh process per configuration and dtype on the GPU: its raw events, and the
    children that failed (each a summary entry, never exact)."""
    names = args.only or list(CONFIGURATIONS)
    results, failures = {}, {}
    for dtype, name in itertools.product(args.dtypes, names):
        key = f"{dtype}-{name}"
        raw = args.output_dir / f"{key}.gpu.json"
        command = [sys.executable, __file__, "--device", args.device, "--child", name, dtype]
        done = subprocess.run([*command, str(raw)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{key}: the child failed: {done.stderr.strip().splitlines()[-1:]}")
            failures[key] = {"error": done.stderr[-2000:]}
            continue
        results[key] = json.loads(raw.read_text())
        raw.unlink()
    return results, failures


if __name__ == "__main__":
    raise SystemExit(main())
