"""Try transformers' model types through `own_model.py estimate --hf-config`, without a GPU:
which ones the trace predicts, which it refuses in one line, which end in a traceback.

    python tests/benchmarks/hf_families.py                       # the types below
    python tests/benchmarks/hf_families.py qwen3 mixtral swin    # these
    python tests/benchmarks/hf_families.py --tasks inference
    python tests/benchmarks/hf_families.py --classifiers distilbert gpt2     # their classifiers

Each type's config is transformers' own default for it (`AutoConfig.for_model`), shrunk to
two layers of width 64 and a vocabulary of 512 where it has those keys (a few types need
more: SHAPES), with the head its `architectures` names; images as the config says (32 pixels
a side; 224 where it names none). With --classifiers, each type's sequence and token
classification heads instead (3 labels; pad_token_id 0 where the config sets none, as a
decoder's classifier needs it for a batch of 2). Each estimate runs in a fresh interpreter
(`--gpu h200 --json`), as a user runs it. Printed per type and task: the prediction's status
and its first unknown operators, or the exit code and the last line said, marked TRACEBACK
where Python printed one. A traceback on a config transformers accepts is a defect of the lab
unless the last line says the model itself raised ("the workload raised ..."): then the model
refuses those shapes on a GPU too. Exit 1 if any estimate ends in a traceback of the lab's
own.
Not a test: it takes about 10 s a type.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by its path: the package is found from the root
from pipeline.workloads import hf_model  # noqa: E402

TYPES = (
    "qwen3", "qwen3_moe", "mixtral", "olmo2", "starcoder2", "gpt_bigcode", "bloom", "stablelm",
    "granite", "cohere", "gptj", "gpt_oss", "smollm3", "glm", "mamba", "deberta-v2",
    "distilbert", "electra", "albert", "xlm-roberta", "modernbert", "mt5", "pegasus",
    "blenderbot", "deit", "mobilevit", "convnext", "resnet", "mobilenet_v2", "efficientnet",
    "regnet", "bit", "poolformer", "focalnet",
)  # fmt: skip
SMALL = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"), 2),
    **dict.fromkeys(("encoder_layers", "decoder_layers", "max_window_layers"), 2),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), 64),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), 4),
    **dict.fromkeys(("encoder_attention_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("intermediate_size", "d_ff", "n_inner", "ffn_dim"), 128),
    **dict.fromkeys(("moe_intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim"), 128),
    **dict.fromkeys(("head_dim", "d_kv"), 16),
    **dict.fromkeys(("num_local_experts", "num_experts"), 4),
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "decoder_vocab_size": 512,
    "patch_size": 8,
    "image_size": 32,
}
# Keys whose defaults would not fit the shrunk ones: the model would refuse them itself.
SHAPES = {
    "gptj": {"rotary_dim": 8},
    "qwen3_moe": {"num_experts_per_tok": 2},
    "gpt_oss": {"num_experts_per_tok": 2},
    "convnext": {
        "hidden_sizes": [16, 32],
        "depths": [1, 1],
        "num_stages": 2,
        "patch_size": 4,
        "image_size": 64,
    },
    "resnet": {"hidden_sizes": [16, 32], "depths": [1, 1], "embedding_size": 16},
}
TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


def shrunk(model_type: str) -> tuple[dict, bool]:
    """(the config, whether its model is an image classifier)."""
    import transformers
    from transformers.models.auto import modeling_auto

    config = transformers.AutoConfig.for_model(model_type).to_dict()
    config = {key: SMALL.get(key, value) for key, value in config.items()}
    for key in ("layer_types", "stage_names", "out_features", "out_indices"):
        config.pop(key, None)  # one entry per layer or stage: the default's count
    config.update(SHAPES.get(model_type, {}))
    for key in TOKENS:
        if isinstance(config.get(key), int) and config[key] >= SMALL["vocab_size"]:
            config[key] = 0
    for mapping, _, kind in hf_model.HEADS:  # the heads own_model.py builds
        names = getattr(modeling_auto, mapping)
        if model_type in names:
            head = names[model_type]
            config["architectures"] = [head if isinstance(head, str) else head[0]]
            return config, kind == "image"
    return config, False


def classifiers(model_type: str, config: dict) -> list[tuple[str, dict]]:
    """(head, config) for each classification head transformers has for the type."""
    from transformers.models.auto import modeling_auto

    found = []
    for kind in ("SEQUENCE", "TOKEN"):
        head = getattr(modeling_auto, f"MODEL_FOR_{kind}_CLASSIFICATION_MAPPING_NAMES").get(
            model_type
        )
        if head:
            head = head if isinstance(head, str) else head[0]
            padded = {"pad_token_id": 0} if config.get("pad_token_id") is None else {}
            found.append((head, {**config, "architectures": [head], "num_labels": 3, **padded}))
    return found


def estimate(path: Path, task: str, image: bool) -> tuple[str, bool]:
    """(what the estimate said in one line, whether it is a traceback of the lab's own)."""
    size = [] if image else ["--dim", "sequence=16"]  # images: the config's side, or 224
    command = [sys.executable, "-m", "pipeline.measuring.own_model", "estimate",
               "--hf-config", str(path), "--task", task, "--dtype", "bfloat16", "--batch", "2",
               "--warmup", "1", "--repeats", "1", *size, "--gpu", "h200", "--json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if result.returncode == 0:
        prediction = json.loads(result.stdout)["prediction"]
        unknown = [entry["op"] for entry in prediction.get("unknown") or []][:3]
        return f"{prediction['status']}  {', '.join(unknown)}", False
    lines = result.stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    traceback = "Traceback (most recent call last)" in result.stderr
    ours = traceback and "the workload raised" not in last
    mark = "TRACEBACK " if traceback else ""
    return f"exit {result.returncode}  {mark}{last[:160]}", ours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", default=list(TYPES), metavar="MODEL_TYPE")
    parser.add_argument("--tasks", default="inference,training", help="comma-separated")
    parser.add_argument("--classifiers", action="store_true", help="their classifier heads")
    args = parser.parse_args()
    ours = 0
    with tempfile.TemporaryDirectory() as folder:
        for model_type in args.types:
            try:
                config, image = shrunk(model_type)
            except (ValueError, KeyError) as exc:
                print(f"{model_type:14} no config: {str(exc).splitlines()[0][:120]}", flush=True)
                continue
            built = classifiers(model_type, config) if args.classifiers else [("", config)]
            if not built:
                print(f"{model_type:14} no classification head", flush=True)
            for head, variant in built:
                path = Path(folder) / f"{model_type}-{head}.json"
                path.write_text(json.dumps(variant, default=str), encoding="utf-8")
                for task in args.tasks.split(","):
                    said, defect = estimate(path, task, image and not head)
                    ours += defect
                    print(f"{model_type:14} {head + ' ' if head else ''}{task:10} {said}",
                          flush=True)  # fmt: skip
    print(f"{ours} traceback(s) of the lab's own")
    return 1 if ours else 0


if __name__ == "__main__":
    raise SystemExit(main())
