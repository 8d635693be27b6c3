"""`own_model.py estimate --hf-config`: Hugging Face models built from published config.json
files (tests/data/hf-configs/, reduced here to a few layers and small widths) and from
transformers' own defaults for more families, traced without a GPU in inference and
training, bfloat16 and float32. The trace follows their real code to the end, the prediction
never says "exact" without a calibration, and the trace allocates what a real CPU run of the
same workload allocates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from kit import mesure_memoire
from pipeline.artefacts import validate
from pipeline.measuring import own_model
from pipeline.predicting import trace_prediction as tp
from pipeline.predicting.trace_prediction import PredictionStatus

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from pipeline.workloads import hf_model  # noqa: E402  (after the skip: it needs nothing, its workloads need transformers)

CONFIGS = ROOT / "tests" / "data" / "hf-configs"
REGISTRY = validate.load_registry()
# A few layers of small width, whatever each family calls them.
SMALL = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"), 2),
    **dict.fromkeys(("encoder_layers", "decoder_layers", "max_window_layers"), 2),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), 64),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), 4),
    **dict.fromkeys(("encoder_attention_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("intermediate_size", "d_ff", "n_inner", "ffn_dim"), 128),
    **dict.fromkeys(("encoder_ffn_dim", "decoder_ffn_dim"), 128),
    **dict.fromkeys(("head_dim", "d_kv"), 16),
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "image_size": 32,
    "patch_size": 8,
}
TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
PUBLISHED = sorted(path.stem for path in CONFIGS.glob("*.json"))
# More lineages, from transformers' defaults for the model type, with their usual head.
MORE = {
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "opt": "OPTForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "falcon": "FalconForCausalLM",
    "roberta": "RobertaForMaskedLM",
    "bart": "BartForConditionalGeneration",
    "mixtral": "MixtralForCausalLM",  # mixture of experts: routed, grouped matmuls
    "mamba": "MambaForCausalLM",  # a state-space model: no attention at all
}
FLOAT32 = ("llama-3.1-8b", "t5-small", "vit-base-patch16-224-in21k", "bert-base-uncased")


def reduced(name: str, **changes) -> dict:
    """The family's config with SMALL's values where it has those keys."""
    if name in MORE:
        config = transformers.AutoConfig.for_model(name).to_dict()
        config = {k: v for k, v in config.items() if k in SMALL or k == "model_type"}
        config["architectures"] = [MORE[name]]
        defaults = transformers.AutoConfig.for_model(name).to_dict()
        config.update({key: defaults.get(key) for key in TOKENS})
    else:
        config = json.loads((CONFIGS / f"{name}.json").read_text())
    config = {key: SMALL.get(key, value) for key, value in config.items()}
    for key in TOKENS:  # special tokens inside the smaller vocabulary
        if isinstance(config.get(key), int) and config[key] >= SMALL["vocab_size"]:
            config[key] = 0
    return {**config, **changes}


def written(tmp_path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def estimate(capsys, path: Path, *options: str, sequence: int | None = 16) -> dict:
    dims = ["--dim", f"sequence={sequence}"] if sequence else []
    argv = ["estimate", "--hf-config", str(path), "--batch", "2", "--warmup", "1"]
    code = own_model.main([*argv, "--repeats", "1", *dims, "--json", *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document = json.loads(captured.out)
    assert validate.validate_document(document, REGISTRY) == []
    return document


def is_image(config: dict) -> bool:
    return config["model_type"] == "vit"


CASES = [
    (name, task, dtype)
    for name in [*PUBLISHED, *MORE]
    for task in ("inference", "training")
    for dtype in ("bfloat16", *(("float32",) if name in FLOAT32 else ()))
]


@pytest.mark.parametrize(("name", "task", "dtype"), CASES)
def test_published_and_other_families_trace_without_a_gpu(capsys, tmp_path, name, task, dtype):
    config = reduced(name)
    sequence = None if is_image(config) else 16
    document = estimate(
        capsys, written(tmp_path, config), "--task", task, "--dtype", dtype, sequence=sequence
    )
    prediction = document["prediction"]
    assert prediction["status"] == PredictionStatus.APPROXIMATE, prediction.get(
        "reason"
    )  # never "exact"
    assert prediction["unknown"]  # and says why
    record = document["workload"]
    assert record["file"] == "config.json"
    assert record["kind"] == ("training" if task == "training" else "inference")
    assert len(prediction["phases"]) == len(record["phases_planned"])
    # The parameters the trace built are the model transformers builds from that config.
    settings = transformers.AutoConfig.for_model(**config)
    auto = getattr(transformers, hf_model.head_of(transformers, settings)[0])
    with torch.device("meta"):
        expected = sum(p.numel() for p in auto.from_config(settings).parameters())
    assert record["parameters"]["count"] == expected
    size = mesure_memoire.DTYPE_BYTES[dtype]
    assert prediction["largest_peak_allocated_bytes"] >= expected * size


# microsoft/resnet-50's config.json, smaller: like every convolutional family it names no
# image size, since it takes any.
RESNET = {
    "model_type": "resnet",
    "architectures": ["ResNetForImageClassification"],
    **{"depths": [1, 1], "hidden_sizes": [32, 64], "embedding_size": 16, "num_labels": 10},
}


@pytest.mark.parametrize(
    ("config", "options", "side"),
    [
        (RESNET, (), 224),  # ImageNet's, as the model cards use
        (RESNET, ("--dim", "image=96"), 96),
        (reduced("vit-base-patch16-224-in21k"), (), 32),  # the config's image_size
        (reduced("vit-base-patch16-224-in21k"), ("--dim", "image=64"), 64),  # built for 64
    ],
)
def test_an_image_model_takes_its_configs_side_or_224_or_the_one_given(
    capsys, tmp_path, config, options, side
):
    """A config without image_size (ResNet's) used to fail in its inputs (AttributeError):
    the image's side is a dimension, recorded, and the input is batch x 3 x side x side."""
    document = estimate(capsys, written(tmp_path, config), *options, sequence=None)
    assert document["workload"]["dimensions"] == {"image": side}
    inputs = next(row for row in document["prediction"]["phases"] if row["phase"] == "inputs")
    pixels = 2 * 3 * side * side * 4  # batch 2, float32
    assert inputs["allocated_bytes"] - inputs["baseline_allocated_bytes"] == -(-pixels // 512) * 512


def test_a_vision_transformer_at_another_side_is_the_model_built_for_that_side(capsys, tmp_path):
    """ViT's position embeddings are one per patch of its config's image_size: at another
    side its forward raised ValueError ("Input image size (384*384) doesn't match model");
    the model is now built for the side given, as a checkpoint fine-tuned at 384 is."""
    config = reduced("vit-base-patch16-224-in21k")  # image 32, patches of 8: 16 + 1 positions
    counts = {}
    for side in (32, 64):
        document = estimate(capsys, written(tmp_path, config), "--dim", f"image={side}",
                            sequence=None)  # fmt: skip
        counts[side] = document["workload"]["parameters"]["count"]
    assert counts[64] - counts[32] == (64 - 16) * SMALL["hidden_size"]  # 64 + 1 positions


def test_convnext_whose_init_reads_a_cpu_schedule_back_is_predicted(capsys, tmp_path):
    """ConvNeXt builds its stochastic-depth rates with torch.linspace(..., device="cpu") and
    reads them back (.tolist()): the trace used to stop there, "not predicted"."""
    config = {"model_type": "convnext", "architectures": ["ConvNextForImageClassification"],
              "depths": [1, 1], "hidden_sizes": [16, 32], "num_stages": 2,
              "drop_path_rate": 0.1, "num_labels": 10}  # fmt: skip
    for task in ("inference", "training"):
        document = estimate(capsys, written(tmp_path, config), "--task", task,
                            "--dim", "image=32", sequence=None)  # fmt: skip
        assert document["prediction"]["status"] == PredictionStatus.APPROXIMATE
        assert document["prediction"]["trace"]["operator_calls"] > 20


def test_a_buffer_the_model_makes_on_the_cpu_is_moved_to_the_device_as_a_user_moves_it(
    capsys, tmp_path
):
    """LeViT makes its attention-bias indices with torch.LongTensor(...), on the CPU whatever
    the device: the lab moves the model it built, as a user's script does (`.to(device)`),
    where it used to refuse it (exit 2) and tell the user to move a model the lab builds."""
    config = {**transformers.AutoConfig.for_model("levit").to_dict(),
              "architectures": ["LevitForImageClassification"]}  # fmt: skip
    for task in ("inference", "training"):
        document = estimate(capsys, written(tmp_path, config), "--task", task, sequence=None)
        assert document["prediction"]["status"] == PredictionStatus.APPROXIMATE


def test_the_8b_config_is_taken_whole_by_its_published_values():
    config = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    settings = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(settings)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248


def test_generate_runs_one_forward_per_new_token_through_the_cache(capsys, tmp_path):
    path = written(tmp_path, reduced("llama-3.1-8b"))
    calls = []
    for tokens in ("2", "12"):
        document = estimate(capsys, path, "--task", "generate", "--new-tokens", tokens)
        assert document["workload"]["kind"] == "custom step"
        assert document["workload"]["dimensions"]["new_tokens"] == int(tokens)
        calls.append(document["prediction"]["trace"]["operator_calls"])
    # the same decoding step 10 more times in each of the 3 steps run (cold, warm-up, warm)
    more = calls[1] - calls[0]
    assert more > 0
    assert more % (10 * 3) == 0


def test_lora_trains_the_adapters_only(capsys, tmp_path):
    path = written(tmp_path, reduced("llama-3.1-8b"))
    full = estimate(capsys, path, "--task", "training")["prediction"]["phases"]
    lora = estimate(capsys, path, "--task", "lora", "--lora-rank", "4")
    assert lora["workload"]["dimensions"]["lora_rank"] == 4
    assert lora["prediction"]["status"] == PredictionStatus.APPROXIMATE
    # AdamW's state: two moments per trainable value, the adapters only
    growth = lambda rows: rows[3]["allocated_bytes"] - rows[3]["baseline_allocated_bytes"]  # noqa: E731
    assert 0 < growth(lora["prediction"]["phases"]) < growth(full) / 4


def test_gradient_checkpointing_lowers_the_training_peak(capsys, tmp_path):
    path = written(tmp_path, reduced("llama-3.1-8b", num_hidden_layers=4))
    plain = estimate(capsys, path, "--task", "training", sequence=128)
    checkpointed = estimate(
        capsys, path, "--task", "training", "--gradient-checkpointing", sequence=128
    )
    assert checkpointed["workload"]["function"] == "training_checkpointed"
    cold = lambda d: d["prediction"]["phases"][2]["peak_allocated_bytes"]  # noqa: E731
    assert cold(checkpointed) < cold(plain)


@pytest.mark.parametrize("name", ["llama-3.2-1b", "gpt2", "qwen2.5-0.5b", "gemma-2-2b"])
def test_gradient_checkpointing_is_predicted_for_a_gpu(capsys, tmp_path, name):
    """Checkpointing runs each layer's forward again inside the backward; for a GPU it must
    make the calls the first forward made (the GPU's attention kernel), or PyTorch counts
    other saved tensors and raises CheckpointError: every decoder did, with --gpu."""
    path = written(tmp_path, reduced(name))
    options = ("--task", "training", "--gpu", "h200")
    plain = estimate(capsys, path, *options, sequence=64)
    checkpointed = estimate(capsys, path, *options, "--gradient-checkpointing", sequence=64)
    assert checkpointed["prediction"]["status"] != PredictionStatus.NOT_PREDICTED
    calls = lambda d: d["prediction"]["trace"]["operator_calls"]  # noqa: E731
    assert calls(checkpointed) > calls(plain)  # the forwards again


def protocol(config: dict, task: str, device: str):
    """own_model's protocol over the config's workload (a cold step, one warm-up, one timed
    step) on `device`, at batch 2 × 16 tokens in float32, for tp.run_trace."""

    def drive(phase):
        configuration = own_model.Configuration(torch.device(device), torch.float32, 2, 0)

        def function(config_, *, sequence, lora_rank=4):
            dims = {"sequence": sequence, **({"lora_rank": lora_rank} if task == "lora" else {})}
            return hf_model.build(config_, config, task, False, **dims)

        dims = {"sequence": 16, **({"lora_rank": 4} if task == "lora" else {})}
        kind = "training" if task in ("training", "lora") else "inference"
        own_model.drive(torch, phase, function, kind, configuration, dims, 1, 1, [], {}, ())

    return drive


def allocations(trace) -> list:
    """Blocks made by operators. Storages of no bytes are no block (a cache starts as
    torch.tensor([]), made outside the dispatcher on the CPU, through it on meta)."""
    events = [event[1] for event in trace.events if event[0] == "op"]
    return [(nbytes, op.name) for op in events for *_, nbytes in op.outputs if nbytes]


def test_the_trace_allocates_what_a_real_cpu_run_of_the_workload_allocates():
    """The oracle: the same training workload run for real on the CPU, recorded by the same
    dispatch mode without fake tensors (eager attention: the meta device has no fused one),
    allocates the same sizes by the same operators, in order: weight initialisation
    included, which transformers skips on the meta device unless told otherwise."""
    config = reduced("llama-3.1-8b", attn_implementation="eager")
    fake = tp.run_trace(torch, "meta", protocol(config, "training", "meta"))
    real = tp.run_trace(torch, "cpu", protocol(config, "training", "cpu"), fake=False)
    assert fake.stopped is None
    assert len(allocations(fake)) > 200
    assert allocations(fake) == allocations(real)


# A fine-tuned classifier's config names its head (and its labels); a pretrained
# checkpoint's names its pretraining head: a copy naming the classifier sizes its fine-tune.
@pytest.mark.parametrize(
    ("name", "head", "task", "labels", "loss", "same"),
    [
        ("bert-base-uncased", "BertForSequenceClassification", "training", {"num_labels": 3},
         "aten.nll_loss_forward", True),
        ("bert-base-uncased", "BertForTokenClassification", "training", {"num_labels": 5},
         "aten.nll_loss_forward", True),  # a label per token
        ("llama-3.2-1b", "LlamaForSequenceClassification", "training",
         {"num_labels": 2, "pad_token_id": 0}, "aten.nll_loss_forward", True),
        # the CPU's mse_loss and float() allocate otherwise than the GPU's, which meta follows
        ("bert-base-uncased", "BertForSequenceClassification", "training", {"num_labels": 1},
         "aten.mse_loss", False),  # one label: a regression
        ("roberta-base", "RobertaForSequenceClassification", "lora",
         {"num_labels": 4, "problem_type": "multi_label_classification"},
         "aten.binary_cross_entropy_with_logits", False),
    ],
)  # fmt: skip
def test_a_classifier_trains_on_the_labels_its_loss_takes_as_a_real_cpu_run_does(
    name, head, task, labels, loss, same
):
    """Labels of the wrong kind or shape make a real run raise (a float target of (batch,
    classes) for multi-label, an index a token): the real CPU run is the oracle. Without
    dropout, whose CPU kernel is not the GPU's the trace follows."""
    config = reduced(name, architectures=[head], attn_implementation="eager", **labels)
    config.update({key: 0.0 for key in ("hidden_dropout_prob", "attention_probs_dropout_prob")})
    fake = tp.run_trace(torch, "meta", protocol(config, task, "meta"))
    real = tp.run_trace(torch, "cpu", protocol(config, task, "cpu"), fake=False)
    assert fake.stopped is None
    assert real.stopped is None
    traced = {op.rsplit(".", 1)[0] for _, op in allocations(fake)}
    assert loss in traced
    assert loss in {op.rsplit(".", 1)[0] for _, op in allocations(real)}
    if same:
        assert allocations(fake) == allocations(real)


def test_a_classifier_is_built_with_its_head_and_its_lora_trains_the_head_whole(capsys, tmp_path):
    config = reduced("bert-base-uncased", architectures=["BertForSequenceClassification"])
    path = written(tmp_path, {**config, "num_labels": 3})
    document = estimate(capsys, path, "--task", "training")
    settings = transformers.AutoConfig.for_model(**config, num_labels=3)
    with torch.device("meta"):
        built = transformers.AutoModelForSequenceClassification.from_config(settings)
    assert document["workload"]["parameters"]["count"] == sum(p.numel() for p in built.parameters())
    assert built.classifier.out_features == 3
    meta = own_model.Configuration(torch.device("meta"), torch.float32, 2, 0)
    lora = hf_model.build(
        meta, {**config, "num_labels": 3}, "lora", False, sequence=16, lora_rank=4
    )
    trained = {n for n, p in lora.model.named_parameters() if p.requires_grad}
    assert any("classifier" in n and "lora_" not in n for n in trained), sorted(trained)
    assert all("lora_" in n or "classifier" in n for n in trained), sorted(trained)


def test_a_decoder_classifier_without_a_pad_token_is_refused_for_a_batch_over_one(capsys, tmp_path):
    """transformers finds each row's last token by pad_token_id and raises without it when
    the batch is over 1: the refusal comes before the trace, in one line."""
    config = reduced("llama-3.2-1b", architectures=["LlamaForSequenceClassification"])
    config.pop("pad_token_id", None)
    path = written(tmp_path, config)
    argv = ["estimate", "--hf-config", str(path), "--dim", "sequence=16", "--json"]
    assert own_model.main([*argv, "--batch", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert "LlamaForSequenceClassification finds each row's last token by the config's " in err
    assert "set pad_token_id in a copy of the file" in err
    assert own_model.main([*argv, "--batch", "1", "--warmup", "1", "--repeats", "1"]) == 0
    capsys.readouterr()
    path.write_text(json.dumps({**config, "pad_token_id": 0}))
    assert own_model.main([*argv, "--batch", "2", "--warmup", "1", "--repeats", "1"]) == 0


BERT = '{"model_type": "bert", "architectures": ["BertForMaskedLM"]}'


@pytest.mark.parametrize(
    ("content", "options", "fragment"),
    [
        (None, (), "no such file"),
        ("{not json", (), "not JSON"),
        ("[1, 2]", (), "not a JSON object"),
        ('{"hidden_size": 64}', (), "no model_type"),
        ('{"model_type": "no-such-model"}', (), "Unrecognized model identifier"),
        (  # a published config cut to 2 layers, its per-layer list left at 28
            json.dumps(
                {
                    "model_type": "qwen3",
                    "num_hidden_layers": 2,
                    "layer_types": ["full_attention"] * 28,
                }
            ),
            (),
            "validate_layer_type': ValueError: `num_hidden_layers` (2) must be equal to the "
            "number of `layer_types` (28)",
        ),
        (
            '{"model_type": "swin", "num_heads": 4}',
            (),
            "Validation error for field 'num_heads': TypeError: Field 'num_heads' with value 4",
        ),
        (BERT, ("--task", "generate"), "bert is not a causal LM"),
        (BERT, ("--gradient-checkpointing",), "--gradient-checkpointing goes with --task training"),
        (  # transformers raised ImportError in model_load where flash-attn is not installed
            '{"model_type": "llama", "attn_implementation": "flash_attention_2"}',
            (),
            "attn_implementation 'flash_attention_2' is not modelled: the lab predicts "
            "PyTorch's attention, 'sdpa' (transformers' default) or 'eager'",
        ),
        (  # question answering: built as the family's causal LM, its memory would be another's
            '{"model_type": "llama", "architectures": ["LlamaForQuestionAnswering"]}',
            (),
            "architectures names LlamaForQuestionAnswering, which the lab does not build for "
            "model_type 'llama': it builds a causal LM, sequence-to-sequence, masked LM, image, "
            "sequence or token classification head",
        ),
        (
            '{"model_type": "bert", "architectures": ["BertForSequenceClassification"]}',
            ("--task", "generate"),
            "bert is not a causal LM",
        ),
        (  # BART's and T5's classifiers pool at each row's eos tokens: values, not shapes
            json.dumps({**reduced("t5-small"), "architectures": ["T5ForSequenceClassification"]}),
            (),
            "T5ForSequenceClassification is not modelled: it pools each row at its "
            "end-of-sequence tokens, found by their values",
        ),
        (  # another family's class: transformers raised KeyError in model_load
            '{"model_type": "llama", "architectures": ["BertForMaskedLM"]}',
            (),
            "architectures names BertForMaskedLM, which the lab does not build",
        ),
        (  # a speech model: built as its causal LM, it failed on input_ids
            '{"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]}',
            (),
            "architectures names WhisperForConditionalGeneration, which the lab does not build",
        ),
        (  # a published AWQ model's config: transformers would build it unquantized
            json.dumps(
                {
                    "model_type": "llama",
                    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
                }
            ),
            (),
            "a quantized model (quantization_config: awq) is not modelled: the lab loads "
            "bitsandbytes' 4-bit checkpoints (load_in_4bit); GPTQ, AWQ, FP8 and other formats",
        ),
        (
            '{"model_type": "llama", "quantization_config": {"load_in_4bit": true}}',
            ("--task", "training"),
            "a 4-bit checkpoint (its config's quantization_config) with --task training: "
            "4-bit weights cannot be trained",
        ),
        ('{"model_type": "llama"}', ("--task", "lora", "--workload", "x.py:f"), "not allowed"),
    ],
)
def test_a_bad_config_is_refused_in_one_line(capsys, tmp_path, content, options, fragment):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    code = own_model.main(["estimate", "--hf-config", str(path), *options])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert fragment in lines[0]


def test_without_dtype_the_model_is_built_in_its_configs_dtype_as_transformers_builds_it(
    capsys, tmp_path
):
    llama = reduced("llama-3.2-1b")  # the published file says "torch_dtype": "bfloat16"
    assert llama["torch_dtype"] == "bfloat16"
    for named, option, expected in [
        ({"torch_dtype": "bfloat16"}, (), "bfloat16"),
        ({"torch_dtype": "bfloat16", "dtype": "float16"}, (), "float16"),  # the newer key first
        ({}, (), "float32"),  # none named: transformers' default, float32
        ({"torch_dtype": "bfloat16"}, ("--dtype", "float32"), "float32"),  # --dtype decides
    ]:
        config = {k: v for k, v in llama.items() if k not in ("torch_dtype", "dtype")} | named
        document = estimate(capsys, written(tmp_path, config), *option)
        assert document["configuration"]["dtype"] == expected, named
        parameters = document["workload"]["parameters"]
        size = {"bfloat16": 2, "float16": 2, "float32": 4}[expected]
        assert parameters["bytes"] == size * parameters["count"], named
    for value in ("auto", "float64", 16, ["bfloat16"]):  # transformers fails on "auto" itself
        config = {**llama, "torch_dtype": value}
        path = written(tmp_path, config)
        assert own_model.main(["estimate", "--hf-config", str(path), "--dtype", "float32"]) == 2
        assert capsys.readouterr().err == (
            f"own_model.py: error: --hf-config {path}: torch_dtype {value!r} is not float32, "
            "float16 or bfloat16, the dtypes the lab builds: change it in a copy of the file\n"
        )


def test_an_architecture_transformers_does_not_know_is_built_by_its_model_type(capsys, tmp_path):
    """Older Llama files say LLaMAForCausalLM; a base model says LlamaModel: both are built as
    the model_type's causal LM, as before, where a known head of another kind is refused."""
    llama = reduced("llama-3.2-1b")
    assert llama["architectures"] == ["LlamaForCausalLM"]
    found = {}
    for names in (
        ["LlamaForCausalLM"],
        ["LLaMAForCausalLM"],
        ["LlamaModel"],
        "LlamaForCausalLM",
        [],
    ):
        document = estimate(capsys, written(tmp_path, {**llama, "architectures": names}))
        found[str(names)] = document["prediction"]["phases"]
    assert len({json.dumps(phases) for phases in found.values()}) == 1, found.keys()


@pytest.mark.parametrize(
    ("name", "table", "task", "fits", "over"),
    [
        ("gpt2", {"n_positions": 32}, "inference", "sequence=32", "sequence=33"),
        ("gpt2", {"n_positions": 32}, "generate", "sequence=30:3", "sequence=30:4"),
        ("roberta-base", {"max_position_embeddings": 34}, "training", "sequence=32", "sequence=33"),
        ("opt-125m", {"max_position_embeddings": 32}, "training", "sequence=32", "sequence=33"),
    ],
)
def test_a_sequence_past_a_learned_position_table_is_refused_as_the_gpu_would_fail(
    capsys, tmp_path, name, table, task, fits, over
):
    """A fake tensor never checks an embedding's indices: at 33 positions of a 32-row table
    the estimate said "exact" for a run the GPU stops with an index out of range. RoBERTa's
    table starts after its padding index (2 rows), OPT's at an offset of 2 (34 rows)."""
    path = written(tmp_path, reduced(name, **table))

    def run(dims: str) -> int:
        sequence, _, new_tokens = dims.partition(":")
        extra = ["--new-tokens", new_tokens] if new_tokens else []
        argv = ["estimate", "--hf-config", str(path), "--task", task, "--dim", sequence]
        return own_model.main([*argv, *extra, "--warmup", "1", "--repeats", "1", "--json"])

    assert run(fits) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert run(over) == 2
    captured = capsys.readouterr()
    needed = 33
    assert captured.err.endswith(
        f": {needed} positions, but this model's learned position embedding holds 32: the GPU "
        "would fail on an index out of range, and a fake tensor does not check it\n"
    )
    assert captured.out == ""


def test_rotary_positions_have_no_table_to_run_past(capsys, tmp_path):
    path = written(tmp_path, reduced("llama-3.2-1b", max_position_embeddings=16))
    document = estimate(capsys, path, sequence=64)  # four times its max_position_embeddings
    assert document["prediction"]["status"] != "not_predicted"


def test_hf_options_without_a_config_are_refused(capsys, tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(config):\n    pass\n")
    code = own_model.main(["estimate", "--workload", f"{path}:f", "--task", "training"])
    assert code == 2
    assert "go with --hf-config" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("task", "option", "said"),
    [
        ("training", ["--new-tokens", "4"], "--new-tokens goes with --task generate, not training"),
        (None, ["--new-tokens", "4"], "--new-tokens goes with --task generate, not inference"),
        (
            "generate",
            ["--lora-rank", "8"],
            "--lora-rank goes with --task lora or qlora, not generate",
        ),
    ],
)
def test_a_task_option_given_to_another_task_is_named_in_one_line(
    capsys, tmp_path, task, option, said
):
    """It was refused as a dimension the task does not declare (`--dim new_tokens`), an
    option the user never typed."""
    path = written(tmp_path, reduced("gpt2"))
    out = tmp_path / "m.json"
    argv = ["measure", "--device", "cuda:0", "--output", str(out), "--hf-config", str(path)]
    assert own_model.main([*argv, *(["--task", task] if task else []), *option]) == 2
    assert capsys.readouterr().err == f"own_model.py: error: {said}\n"
    assert not out.exists()


def test_without_transformers_a_config_is_refused_in_one_line(capsys, tmp_path, monkeypatch):
    real = hf_model.importlib.util.find_spec
    monkeypatch.setattr(
        hf_model.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else real(name, *a),
    )
    path = written(tmp_path, reduced("gpt2"))
    assert own_model.main(["estimate", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "needs transformers" in err


def test_measure_runs_the_same_workload_with_its_prediction_beside(tmp_path):
    """`measure --hf-config` on the CPU standing in for the GPU: the protocol's rows, the
    config named and hashed, and the trace's prediction beside, never claimed exact."""
    import hashlib

    import runfixtures

    path = written(tmp_path, reduced("gpt2"))
    flags = ["--hf-config", str(path), "--task", "training", "--dim", "sequence=8"]
    assert runfixtures.own_model_run(tmp_path, [*flags, "--warmup", "1", "--repeats", "1"]) == 0
    document = json.loads((tmp_path / "measurement.json").read_text())
    assert validate.validate_document(document, REGISTRY) == []
    assert document["status"] == "completed"
    record = document["workload"]
    assert (record["file"], record["function"]) == ("config.json", "training")
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["phases_run"] == record["phases_planned"]
    assert document["prediction"]["status"] == PredictionStatus.APPROXIMATE


@pytest.mark.parametrize(
    ("head", "labels", "shape", "dtype"),
    [
        ("BertForSequenceClassification", {"num_labels": 3}, (2,), torch.int64),
        ("BertForSequenceClassification", {"num_labels": 1}, (2,), torch.bfloat16),  # regression
        ("BertForSequenceClassification",
         {"num_labels": 4, "problem_type": "multi_label_classification"}, (2, 4), torch.float32),
        ("BertForTokenClassification", {"num_labels": 5}, (2, 16), torch.int64),
        ("BertForMaskedLM", {}, (2, 16), torch.int64),  # labels = inputs
    ],
)  # fmt: skip
def test_a_classifiers_labels_are_what_a_data_collator_gives_its_loss(head, labels, shape, dtype):
    """Class indices as int64, multi-label targets as float32 (torch's default for Python
    floats), one a row or one a token; a regression's values in the model's dtype (here
    bfloat16), which the GPU's mse_loss backward needs."""
    config = reduced("bert-base-uncased", architectures=[head], **labels)
    meta = own_model.Configuration(torch.device("meta"), torch.bfloat16, 2, 0)
    workload = hf_model.build(meta, config, "training", False, sequence=16)
    made = workload.make_inputs()["labels"]
    assert (tuple(made.shape), made.dtype) == (shape, dtype)


def test_a_classifiers_lora_says_nothing_of_peft_and_transformers_versions():
    """peft's classifier wrapper reads a property transformers deprecates: the user would see
    a FutureWarning above every answer, about two libraries they cannot change."""
    import warnings

    config = reduced("roberta-base", architectures=["RobertaForSequenceClassification"])
    meta = own_model.Configuration(torch.device("meta"), torch.float32, 2, 0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        hf_model.build(meta, config, "lora", False, sequence=16, lora_rank=4)
    assert [str(w.message) for w in said if w.category is FutureWarning] == []


def test_a_config_holding_infinity_is_built_as_json_reads_it(capsys, tmp_path):
    """JSON's Infinity and NaN (Falcon-H1's time_step_limit is [0.0, Infinity]) are floats
    to json.loads; written into the workload as repr they were `inf`, a NameError."""
    config = reduced("llama-3.2-1b", time_step_limit=[0.0, float("inf")], rope_nan=float("nan"))
    path = written(tmp_path, config)
    assert "Infinity" in path.read_text()
    document = estimate(capsys, path, "--task", "inference")
    assert document["prediction"]["phases"]
    assert document["workload"]["file"] == "config.json"


def test_a_sweeps_later_point_past_batch_one_is_refused_where_the_model_is_built():
    """A sweep checks its base; a point whose batch grows past 1 meets the same rule in
    build, before anything runs."""
    config = reduced("llama-3.2-1b", architectures=["LlamaForSequenceClassification"])
    config.pop("pad_token_id", None)
    meta = lambda batch: own_model.Configuration(torch.device("meta"), torch.float32, batch, 0)  # noqa: E731
    assert hf_model.build(meta(1), config, "training", False, sequence=16).model is not None
    with pytest.raises(own_model.cli.UsageError, match="--batch 4: LlamaForSequenceClassification"):
        hf_model.build(meta(4), config, "training", False, sequence=16)


@pytest.mark.parametrize("option", [["--load-in-4bit"], ["--optim", "sgd"], ["--bf16"]])
def test_a_recipe_option_without_a_config_is_refused_in_one_line(capsys, tmp_path, option):
    path = tmp_path / "m.py"
    path.write_text("def f(config):\n    pass\n")
    code = own_model.main(["estimate", "--workload", f"{path}:f", *option])
    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"own_model.py: error: {option[0]}: goes with --hf-config"), line


def test_bitsandbytes_cpu_kernel_notice_is_dropped_and_other_warnings_kept(caplog):
    """bitsandbytes' notice of a CPU kernel the lab never runs is not shown; its other
    warnings are."""
    import logging

    hf_model.require("inference")
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make "
            "sure you already `pip install kernels`",
            "No module named 'kernels'",
        )
        logger.warning("another warning")
    assert [record.getMessage() for record in caplog.records] == ["another warning"]
