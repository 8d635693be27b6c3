"""A Hugging Face model by its config.json, as an own-model workload: `own_model.py estimate|
measure --hf-config FILE.json --task inference|generate|training|lora`.

The model is built with transformers from the config alone (`from_config`: random weights,
nothing downloaded), directly on the device in the run's dtype. The task is a workload
function of the usual contract (own_model.Workload), generated as a few lines of Python that
hold the config (`workload_file`): the trace and the measurement run it as they run a user's
file, one path for both. Tasks:

- inference: one forward over batch × sequence tokens (images: batch × 3 × image × image), under
  torch.inference_mode(), with the model's defaults (a causal LM returns its KV cache too);
- generate: greedy decoding of `new_tokens` tokens after a prefill of the sequence, with the
  model's own DynamicCache, as generate()'s loop does (the prefill keeps the last logits
  only); its stopping checks, which read values, are left out: all tokens are generated;
- training: full fine-tuning, AdamW, labels = inputs (classifiers: random labels, one per
  image, sequence or token, as the config's num_labels and problem_type say);
- lora: peft LoRA of rank `lora_rank` on the modules peft targets for the family (its
  attention projections), AdamW over the adapters (and over a classifier's head, which peft
  trains whole for a classification task);
- qlora: QLoRA as peft's and bitsandbytes' guides write it: the model loaded in 4 bits (NF4,
  double quantisation, bfloat16 compute unless --bnb-4bit-* say otherwise),
  `peft.prepare_model_for_kbit_training` (norms and embeddings to float32, checkpointing on),
  then the lora task's adapters and AdamW.
`--load-in-4bit` (with BitsAndBytesConfig's --bnb-4bit-quant-type, --bnb-4bit-use-double-quant,
--bnb-4bit-compute-dtype) loads the model as from_pretrained does with that config, from a
checkpoint of zero weights in the run's dtype: each weight moved to the device, then
quantised by bitsandbytes (`load_quantized`).
`--gradient-checkpointing` turns on the model's own (non-reentrant) checkpointing. A training
or lora task takes what a Trainer run adds, in TrainingArguments' words (Recipe): `--optim
NAME` (the optimizer the Trainer makes for that name, with its parameter groups),
`--gradient-accumulation-steps N` (N micro-batches a step), `--bf16` (the forward under CUDA
autocast to bfloat16, as accelerate runs it for TrainingArguments(bf16=True); the weights stay
in the run's dtype), `--fp16` (the same to float16, the loss scaled by a CUDA GradScaler, as
accelerate makes it for TrainingArguments(fp16=True)).

transformers (and peft for lora) are imported only here, when a config is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import logging
import warnings
from pathlib import Path

from pipeline.core import allocator_model, cli
from pipeline.core.workload_contract import Workload, WorkloadFile
from pipeline.workloads import hf_config

TASKS = ("inference", "generate", "training", "lora", "qlora")
ADAPTED = ("lora", "qlora")  # tasks that train LoRA adapters
TRAINED = ("training", *ADAPTED)
SEQUENCE, NEW_TOKENS, LORA_RANK, IMAGE_SIDE = 128, 16, 8, 224
# The model classes a task builds, by the mapping that names the config's architecture;
# a base model (or a class transformers does not know) is built as the first of these that
# has its model_type.
BY_MODEL_TYPE = (
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM", "causal"),
    ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM", "seq2seq"),
    ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM", "masked"),
    ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification", "image"),
)
HEADS = (
    *BY_MODEL_TYPE,
    # named by the config's architectures only
    ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification",
     "sequence-classification"),
    ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "AutoModelForTokenClassification",
     "token-classification"),
)  # fmt: skip
BUILT = "causal LM, sequence-to-sequence, masked LM, image, sequence or token classification"
# peft's task for a classifier's LoRA: its head (score, classifier) is then trained whole
PEFT_TASKS = {"sequence-classification": "SEQ_CLS", "token-classification": "TOKEN_CLS"}
MISSING = (
    "--hf-config needs transformers{peft}, not installed here: "
    "pip install 'transformers==5.23.0'{peft_pin} (pyproject.toml's `hf` group)"
)


# BitsAndBytesConfig's 4-bit options, at its defaults, and at the QLoRA paper's (Dettmers et
# al. 2023, as peft's and bitsandbytes' guides set them), which --task qlora takes
FOUR_BIT_DEFAULTS = {"quant_type": "fp4", "use_double_quant": False, "compute_dtype": "float32"}
QLORA_DEFAULTS = {"quant_type": "nf4", "use_double_quant": True, "compute_dtype": "bfloat16"}
COMPUTE_DTYPES = ("float32", "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a run adds to the model built from its config: a 4-bit load in
    BitsAndBytesConfig's words, and a Trainer's options in TrainingArguments' words. The
    defaults are the lab's own step: weights in the run's dtype, AdamW (foreach, as torch
    picks on a GPU), one micro-batch, no autocast."""

    optim: str | None = None
    gradient_accumulation_steps: int = 1
    bf16: bool = False
    fp16: bool = False
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = FOUR_BIT_DEFAULTS["quant_type"]
    bnb_4bit_use_double_quant: bool = FOUR_BIT_DEFAULTS["use_double_quant"]
    bnb_4bit_compute_dtype: str = FOUR_BIT_DEFAULTS["compute_dtype"]
    # the 4-bit load is a checkpoint's own: its config's quantization_config says it
    prequantized: bool = False
    load_in_8bit: bool = False  # LLM.int8, at BitsAndBytesConfig's defaults

    def given(self) -> dict:
        """The options that differ from the lab's own step (what a run records)."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != field.default
        }

    def quantization(self) -> dict | None:
        """BitsAndBytesConfig's arguments, or None where the model is not quantized."""
        if self.load_in_8bit:
            return {"load_in_8bit": True}
        if not self.load_in_4bit:
            return None
        return {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": self.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": self.bnb_4bit_use_double_quant,
            "bnb_4bit_compute_dtype": self.bnb_4bit_compute_dtype,
        }


def four_bit_recipe(task: str, load_in_4bit: bool, stored: dict | None = None, **given) -> dict:
    """The 4-bit fields of a Recipe from the options given (None: not given): --task qlora
    loads in 4 bits with QLoRA's defaults, --load-in-4bit with BitsAndBytesConfig's; the
    --bnb-4bit-* options go with one of them. A checkpoint quantized already (`stored`:
    stored_quantization's fields) is loaded as its config says, and takes none of them."""
    named = {key: value for key, value in given.items() if value is not None}
    if stored is not None:
        if load_in_4bit or named:
            option = (
                "--load-in-4bit"
                if load_in_4bit
                else "--bnb-4bit-" + next(iter(named)).replace("_", "-")
            )
            raise cli.UsageError(
                f"{option}: the config's quantization_config says how its checkpoint is "
                "quantized (bitsandbytes, 4 bits): the model is loaded as it says"
            )
        return stored
    if task != "qlora" and not load_in_4bit:
        if named:
            option = "--bnb-4bit-" + next(iter(named)).replace("_", "-")
            raise cli.UsageError(f"{option} goes with --load-in-4bit or --task qlora")
        return {}
    defaults = QLORA_DEFAULTS if task == "qlora" else FOUR_BIT_DEFAULTS
    return {"load_in_4bit": True} | {
        f"bnb_4bit_{key}": named.get(key, default) for key, default in defaults.items()
    }


def check_recipe(recipe: Recipe, task: str) -> None:
    """A recipe the lab runs as the Trainer would, else one line."""
    trainer = {
        name: value
        for name, value in recipe.given().items()
        if name in ("optim", "gradient_accumulation_steps", "bf16", "fp16")
    }
    if trainer and task not in TRAINED:
        options = ", ".join("--" + name.replace("_", "-") for name in trainer)
        raise cli.UsageError(f"{options}: a Trainer's options, for --task training, lora or qlora")
    if recipe.load_in_8bit and recipe.load_in_4bit:
        raise cli.UsageError(
            "--load-in-8bit: the config's quantization_config says how its checkpoint is "
            "quantized (bitsandbytes, 4 bits): the model is loaded as it says"
            if recipe.prequantized
            else "--load-in-8bit with "
            + ("--task qlora" if task == "qlora" else "--load-in-4bit")
            + ": the weights are loaded in 8 or in 4 bits, not both"
        )
    if recipe.load_in_4bit or recipe.load_in_8bit:
        if task == "training":
            bits, adapted = (4, "qlora") if recipe.load_in_4bit else (8, "lora")
            said = (
                "a 4-bit checkpoint (its config's quantization_config)"
                if recipe.prequantized
                else f"--load-in-{bits}bit"
            )
            raise cli.UsageError(
                f"{said} with --task training: {bits}-bit weights cannot be trained (the "
                f"Trainer refuses a purely quantized model); --task {adapted} trains LoRA "
                "adapters over them"
            )
        if importlib.util.find_spec("bitsandbytes") is None:
            raise cli.UsageError(
                "--load-in-4bit, --load-in-8bit and --task qlora load the model with "
                "bitsandbytes, not installed "
                "here: pip install 'bitsandbytes==0.50.2' (pyproject.toml's `bnb` group)"
            )
    if recipe.optim is not None:
        trainer_optimizer_class(recipe.optim)
    mixed = "--bf16" if recipe.bf16 else "--fp16" if recipe.fp16 else None
    if mixed and importlib.util.find_spec("accelerate") is None:
        raise cli.UsageError(
            f"{mixed} runs the forward as accelerate does for the Trainer, not installed here: "
            "pip install 'accelerate==1.16.0' (pyproject.toml's `hf` group)"
        )


def trainer_optimizer_class(optim: str):
    """The optimizer class and arguments the Trainer takes for TrainingArguments(optim=...)
    (Trainer.get_optimizer_cls_and_kwargs); refused in one line where the name is not one of
    TrainingArguments' or the optimizer is not one the trace follows (torch.optim's,
    transformers' Adafactor, which is Python over torch's operators, and bitsandbytes' 8-bit
    AdamW, paged where no state would leave the allocator's blocks: refuse_paged_state;
    bnb_optimizers.py)."""
    import transformers
    from transformers.training_args import OptimizerNames

    if optim not in {name.value for name in OptimizerNames}:
        raise cli.UsageError(
            f"--optim {optim}: not one of TrainingArguments' optim names "
            "(transformers.training_args.OptimizerNames): adamw_torch, adamw_torch_fused, "
            "adafactor, sgd, ..."
        )
    try:
        cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(trainer_arguments(optim))
    except (ImportError, ValueError) as exc:
        said = " ".join(str(exc).split())
        raise cli.UsageError(f"--optim {optim}: {said[:200]}") from None
    if not (
        cls.__module__.startswith("torch.optim.")
        or cls is transformers.Adafactor
        or (bitsandbytes_adamw(cls) and kwargs.get("optim_bits") == 8)
    ):
        raise cli.UsageError(
            f"--optim {optim}: {cls.__module__}.{cls.__name__} is not modelled: the lab "
            "predicts torch.optim's optimizers, transformers' Adafactor and bitsandbytes' "
            "8-bit AdamW (adamw_8bit)"
        )
    return cls, kwargs


def bitsandbytes_adamw(cls) -> bool:
    """bitsandbytes.optim.AdamW, whose 8-bit state bnb_optimizers.py follows from source."""
    if not cls.__module__.startswith("bitsandbytes."):
        return False
    import bitsandbytes

    return cls is bitsandbytes.optim.AdamW


def trainer_arguments(optim: str):
    """TrainingArguments with this optim and the rest at their defaults; nothing is written
    (output_dir is read only when the Trainer saves)."""
    import transformers

    return transformers.TrainingArguments(output_dir="unused", optim=optim, report_to="none")


def read_config(path: Path) -> dict:
    """The config.json, checked before anything is built: a JSON object naming its model_type,
    within the limits and relations hf_config.py states."""
    config = hf_config.read(path)
    if not isinstance(config.get("model_type"), str):
        raise cli.UsageError(f"--hf-config {path}: no model_type (not a transformers config.json)")
    hf_config.check_sizes(config, path)
    for key in ("dtype", "torch_dtype"):  # transformers turns it into torch's attribute
        value = config.get(key)
        if value is not None and not (
            isinstance(value, str) and value in allocator_model.DTYPE_BYTES
        ):
            raise cli.UsageError(
                f"--hf-config {path}: {key} {value!r} is not float32, float16 or "
                "bfloat16, the dtypes the lab builds: change it in a copy of the file"
            )
    for key in ("attn_implementation", "_attn_implementation"):
        if config.get(key) not in (None, "sdpa", "eager"):
            raise cli.UsageError(
                f"--hf-config {path}: {key} {config[key]!r} is not modelled: the lab predicts "
                "PyTorch's attention, 'sdpa' (transformers' default) or 'eager'; remove it "
                "from a copy of the file to predict the model with sdpa"
            )
    stored_quantization(config, path)  # refused in one line unless the lab loads it
    return config


def stored_quantization(config: dict, path: Path) -> dict | None:
    """The Recipe fields of a checkpoint bitsandbytes quantized in 4 bits, as its config says
    (quantization_config as BitsAndBytesConfig.to_dict writes it; transformers takes
    load_in_4bit for bitsandbytes whatever quant_method says: AutoQuantizationConfig.from_dict),
    `prequantized` among them; None for a model without quantization_config. Any other
    quantization is refused in one line: built from its config, transformers would make it
    unquantized, under the quantized model's name."""
    stored = config.get("quantization_config")
    if stored is None:
        return None
    method = stored.get("quant_method") if isinstance(stored, dict) else None
    named = f": {method}" if isinstance(method, str) else ""
    if not isinstance(stored, dict) or stored.get("load_in_4bit") is not True:
        eight = isinstance(stored, dict) and stored.get("load_in_8bit") is True
        raise cli.UsageError(
            f"--hf-config {path}: a quantized model (quantization_config{named}) is not "
            "modelled: the lab loads bitsandbytes' 4-bit checkpoints (load_in_4bit); "
            + (
                "an 8-bit checkpoint's own load is not modelled: remove quantization_config "
                "from a copy of the file and give --load-in-8bit (the same model quantised "
                "as it loads, its load's peak higher)"
                if eight
                else "GPTQ, AWQ, FP8 and other formats have their own weights and kernels; to "
                "size the unquantized model, remove quantization_config from a copy of the "
                "file"
            )
        )
    fields = {
        "bnb_4bit_quant_type": (FOUR_BIT_DEFAULTS["quant_type"], ("nf4", "fp4")),
        "bnb_4bit_use_double_quant": (FOUR_BIT_DEFAULTS["use_double_quant"], (True, False)),
        # to_dict writes the dtype's name; None is float32, BitsAndBytesConfig's default
        "bnb_4bit_compute_dtype": (FOUR_BIT_DEFAULTS["compute_dtype"], COMPUTE_DTYPES),
        # another storage (FSDP's QLoRA packs 4-bit values into bfloat16) is not traced
        "bnb_4bit_quant_storage": ("uint8", ("uint8",)),
    }
    recipe = {"load_in_4bit": True, "prequantized": True}
    for key, (default, allowed) in fields.items():
        value = stored.get(key)
        value = default if value is None else value
        if not any(value is known or (type(value) is str and value == known) for known in allowed):
            raise cli.UsageError(
                f"--hf-config {path}: quantization_config's {key} {value!r} is not modelled "
                f"(the lab loads {', '.join(map(str, allowed))})"
            )
        if key != "bnb_4bit_quant_storage":
            recipe[key] = value
    return recipe


class BitsandbytesNotices(logging.Filter):
    """Two messages bitsandbytes logs about its own kernels, dropped: imported on a CPU with
    AVX512-BF16, it looks for a CPU 4-bit kernel of the `kernels` package and warns where it
    is absent (backends/cpu/ops.py), a kernel the lab never runs; and each 8-bit product of a
    non-float16 input warns that the input is cast to float16 (autograd/_functions.py), once
    a layer a step: the cast is traced and measured, and said in the user guide."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            "gemm_4bit_forward from kernels-community" in message
            or message.startswith("MatMul8bitLt: inputs will be cast from")
        )


# one filter for the process: adding the same one again is a no-op (logging.Filterer), and
# `require` runs for every config read (plan estimates many in one process)
BITSANDBYTES_NOTICES = BitsandbytesNotices()
NOTICE_LOGGERS = ("bitsandbytes.backends.cpu.ops", "bitsandbytes.autograd._functions")


def require(task: str) -> None:
    """transformers (and peft for lora) importable, else one line."""
    for name in NOTICE_LOGGERS:
        logging.getLogger(name).addFilter(BITSANDBYTES_NOTICES)
    needed = ["transformers"] + (["peft"] if task in ADAPTED else [])
    if any(importlib.util.find_spec(name) is None for name in needed):
        peft = task in ADAPTED
        raise cli.UsageError(
            MISSING.format(
                peft=" and peft" if peft else "", peft_pin=" 'peft==0.21.2'" if peft else ""
            )
        )


def head_of(transformers, config) -> tuple[str, str]:
    """(auto class, kind) for the config: the head its architecture names for its model_type;
    for a base model or a class transformers does not know (a fork's, a remote one), the
    first language or image head that has its model_type. An architecture transformers
    builds another way (question answering, a speech model, another family's class) is
    refused: built as the first head of its model_type, its memory would be another
    model's."""
    from transformers.models.auto import modeling_auto

    def classes(value) -> tuple[str, ...]:
        return value if isinstance(value, tuple) else (value,)

    architectures = config.architectures or []
    if isinstance(architectures, str):  # a file that names one class without its list
        architectures = [architectures]
    for mapping, auto, kind in HEADS:
        built = classes(getattr(modeling_auto, mapping).get(config.model_type, ()))
        if any(name in built for name in architectures):
            return auto, kind
    heads = {
        name
        for mapping in dir(modeling_auto)
        if mapping.endswith("_MAPPING_NAMES") and mapping != "MODEL_MAPPING_NAMES"
        for value in getattr(modeling_auto, mapping).values()
        for name in classes(value)
    } - set(modeling_auto.MODEL_MAPPING_NAMES.values())
    if refused := [name for name in architectures if name in heads]:
        raise cli.UsageError(
            f"--hf-config: architectures names {refused[0]}, which the lab does not build for "
            f"model_type {config.model_type!r}: it builds a {BUILT} head"
        )
    for mapping, auto, kind in BY_MODEL_TYPE:
        if config.model_type in getattr(modeling_auto, mapping):
            return auto, kind
    raise cli.UsageError(
        f"--hf-config: model_type {config.model_type!r} has no causal LM, sequence-to-sequence, "
        "masked LM or image classification head in transformers"
    )


def refuse_classifier(model_class, settings, batch: int) -> None:
    """A sequence classifier the lab cannot run as built: an encoder-decoder's (BART's,
    T5's) pools each row at its end-of-sequence tokens, found by value; a decoder's
    (Llama's, GPT-2's) finds each row's last token by pad_token_id, and transformers
    refuses a batch over 1 without it."""
    name = model_class.__name__
    if settings.is_encoder_decoder:
        raise cli.UsageError(
            f"--hf-config: {name} is not modelled: it pools each row at its end-of-sequence "
            "tokens, found by their values (the same count in every row, or it raises), "
            "which random tokens do not have and a trace cannot follow"
        )
    if (
        batch > 1
        and settings.pad_token_id is None
        and "pad_token_id" in inspect.getsource(model_class.forward)
    ):
        raise cli.UsageError(
            f"--batch {batch}: {name} finds each row's last token by the config's "
            "pad_token_id, which it does not set (transformers refuses a batch over 1 "
            "without it): set pad_token_id in a copy of the file"
        )


def check(config: dict, task: str, path: Path, batch: int) -> str:
    """Everything that can be refused in one line before a trace (and before a chain makes
    a run folder): returns the model's kind."""
    require(task)
    import transformers
    from huggingface_hub.errors import StrictDataclassError  # transformers' own dependency

    hf_config.check_rope(config, path)
    try:
        built = transformers.AutoConfig.for_model(**config)
        built.validate()  # transformers' own checks (huggingface_hub's strict dataclass)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        # huggingface_hub's validators (a field's type; layer_types against the layer count)
        # say what and why on two lines: one line here
        said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise cli.UsageError(f"--hf-config {path}: {said[:300] or type(exc).__name__}") from None
    auto, kind = head_of(transformers, built)
    if kind == "sequence-classification":
        refuse_classifier(getattr(transformers, auto)._model_mapping[type(built)], built, batch)
    if task == "generate" and kind != "causal":
        raise cli.UsageError(f"--task generate: {config['model_type']} is not a causal LM")
    if task in ADAPTED:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

        if config["model_type"] not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
            raise cli.UsageError(
                f"--task {task}: peft names no attention projections for {config['model_type']}"
            )
    return kind, built


def dimensions(task: str, kind: str, config: dict) -> dict[str, int]:
    """The workload's --dim names and defaults. An image's side is the config's image_size;
    convolutional families (ResNet, RegNet, ...) take any size and do not say one: there,
    ImageNet's 224 pixels, as their model cards use."""
    if kind == "image":
        side = config.get("image_size")
        dims = {"image": side if isinstance(side, int) and side > 0 else IMAGE_SIDE}
    else:
        dims = {"sequence": SEQUENCE}
    if task == "generate":
        dims["new_tokens"] = NEW_TOKENS
    if task in ADAPTED:
        dims["lora_rank"] = LORA_RANK
    return dims


def function_name(task: str, checkpointing: bool) -> str:
    return f"{task}_checkpointed" if checkpointing else task


def workload_source(
    config: dict, task: str, kind: str, checkpointing: bool, recipe: Recipe = Recipe()
) -> str:
    """The workload file for this config and task: its dimensions are keyword-only integers."""
    dims = dimensions(task, kind, config)
    name = function_name(task, checkpointing)
    signature = "".join(f", {key}={value}" for key, value in dims.items())
    signature = f", *{signature}" if dims else ""
    options = recipe.given()
    passed = (f", {options!r}" if options else "") + "".join(f", {key}={key}" for key in dims)
    return (
        '"""A Hugging Face model by its config, built by own_model.py --hf-config."""\n\n'
        "import json\n\n"
        + (
            # imported before the trace begins, as a user's script imports them: the trace
            # then follows their load as a GPU runs it (predicting/quantized_load.py)
            "import bitsandbytes.nn.modules  # noqa: F401\n"
            "import transformers.modeling_utils  # noqa: F401\n\n"
            if recipe.load_in_4bit or recipe.load_in_8bit
            else ""
        )
        + "from pipeline.workloads import hf_model\n\n"
        # JSON, not repr: a config's Infinity or NaN (Falcon-H1's time_step_limit) is `inf`
        # to repr, a name Python does not know
        f"CONFIG = json.loads({json.dumps(config)!r})\n\n\n"
        f"def {name}(config{signature}):\n"
        f"    return hf_model.build(config, CONFIG, {task!r}, {checkpointing!r}{passed})\n"
    )


def workload_file(
    path: Path,
    task: str,
    checkpointing: bool,
    batch: int,
    given: list[tuple[str, int]] = (),
    steps: int = 1,
    budget: int = hf_config.LAYER_PASS_BUDGET,
    recipe: Recipe = Recipe(),
    config: dict | None = None,
) -> tuple[WorkloadFile, str | None]:
    """A WorkloadFile for a config.json, named and hashed by the config's bytes; and the dtype
    the config names (`dtype`, or `torch_dtype` as older files say), which transformers
    builds the model in when it is given none, or None. Refused up front: a trace of `steps`
    steps with the dimensions `given` (--dim, --new-tokens, --lora-rank) over the budget
    (hf_config.over_budget), and a LoRA rank over the model's width. `config`: the file as
    read_config read it, where the caller has read it already."""
    if checkpointing and task == "qlora":
        raise cli.UsageError(
            "--gradient-checkpointing with --task qlora: it is on already "
            "(prepare_model_for_kbit_training turns it on, as peft's QLoRA recipe does)"
        )
    if checkpointing and task not in TRAINED:
        raise cli.UsageError(
            f"--gradient-checkpointing goes with --task training or lora: {task} keeps no "
            "activations for a backward pass"
        )
    config = read_config(path) if config is None else config  # read_config's, read once
    kind, built = check(config, task, path, batch)
    check_recipe(recipe, task)
    dims = {**dimensions(task, kind, config), **dict(given)}
    # each micro-batch is a forward of its own
    passes = steps * recipe.gradient_accumulation_steps
    if refused := hf_config.over_budget(built, task, dims, batch, passes, budget):
        raise cli.UsageError(refused)
    width = getattr(built.get_text_config(), "hidden_size", None)
    if task in ADAPTED and isinstance(width, int) and dims["lora_rank"] > width:
        raise cli.UsageError(
            f"--lora-rank {dims['lora_rank']}: over the model's width {width}, the most a "
            "LoRA adapter of its projections can use"
        )
    source = workload_source(config, task, kind, checkpointing, recipe)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    named = config.get("dtype") or config.get("torch_dtype")
    name = function_name(task, checkpointing)
    return WorkloadFile(path, name, source, digest, recipe.given() or None), named


# ---------------------------------------------------------------- inside the workload


def build(config, hf: dict, task: str, checkpointing: bool, recipe: dict | None = None, **dims):
    """The Workload (own_model's contract) for this model and task; `recipe`: a Recipe's
    given() options."""
    import torch
    import transformers

    if isinstance(hf.get("image_size"), int) and "image" in dims:
        # a side other than the config's is the model built for that side (its position
        # embeddings for that many patches), as a checkpoint fine-tuned at 384 pixels is
        hf = {**hf, "image_size": dims["image"]}
    settings = transformers.AutoConfig.for_model(**hf)
    auto, kind = head_of(transformers, settings)
    # The model's module is imported before the device context, as a user's script imports it:
    # a tensor made at import time (torchaudio's, which transformers imports where it is
    # installed) would otherwise be made on the GPU and held there for the whole run.
    model_class = getattr(transformers, auto)._model_mapping[type(settings)]
    recipe = Recipe(**(recipe or {}))
    if recipe.prequantized:  # loaded onto the device by from_pretrained
        model = load_prequantized(torch, transformers, model_class, settings, hf, config)
    elif recipe.load_in_4bit or recipe.load_in_8bit:
        model = load_quantized(torch, transformers, model_class, settings, config, recipe)
    else:
        with torch.device(config.device), initialised_as_on_a_gpu(transformers, config.device):
            model = getattr(transformers, auto).from_config(settings, dtype=config.dtype)
        # A tensor the model makes on the CPU whatever the device (LeViT's attention bias
        # indices, `torch.LongTensor(...)`) is moved as a user's script moves the model: a
        # copy to the GPU, in model_load. The rest is there already, and `.to` leaves it alone.
        model = model.to(config.device)
    if recipe.load_in_4bit and task in ("inference", "generate"):
        refuse_bias_casts(torch, model, config, recipe)
    if "sequence" in dims:  # the generation's last token sits at sequence + new_tokens - 2
        needed = dims["sequence"] + (dims["new_tokens"] - 1 if task == "generate" else 0)
        limit = learned_positions(torch, model)
        if limit is not None and needed > limit:
            raise cli.UsageError(
                f"--dim sequence={dims['sequence']}"
                + (f" with --new-tokens {dims['new_tokens']}" if task == "generate" else "")
                + f": {needed} positions, but this model's learned position embedding holds "
                f"{limit}: the GPU would fail on an index out of range, and a fake tensor does "
                "not check it"
            )
    if kind == "sequence-classification":  # a sweep's later points: their own batch
        refuse_classifier(type(model), settings, config.batch)
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    make_inputs = inputs_for(
        torch, config, model, kind, task, dims.get("sequence", dims.get("image"))
    )
    if task == "inference":
        return Workload(model.eval(), make_inputs)
    if task == "generate":
        return Workload(model.eval(), make_inputs, step=greedy(torch, dims["new_tokens"]))
    if task in ADAPTED:
        import peft

        if task == "qlora":
            # peft turns checkpointing on without use_reentrant, which torch.utils.checkpoint
            # then takes as True (reentrant), warning at the first checkpointed call that
            # the argument should be given: about peft's call, not the run's; the run is
            # traced and measured as it is
            warnings.filterwarnings(
                "ignore", "torch.utils.checkpoint: the use_reentrant parameter", UserWarning
            )
            with warnings.catch_warnings():
                # it enables checkpointing through transformers' deprecated alias
                warnings.filterwarnings("ignore", "`gradient_checkpointing_enable`", FutureWarning)
                model = peft.prepare_model_for_kbit_training(model)
        rank = dims["lora_rank"]
        lora = {"r": rank, "lora_alpha": 2 * rank}
        if kind in PEFT_TASKS:
            lora["task_type"] = PEFT_TASKS[kind]
        with warnings.catch_warnings():
            # peft 0.21's classifier wrapper reads a property transformers 5 deprecates: a
            # warning about the two libraries, which nobody running the lab can act on
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
            model = peft.get_peft_model(model, peft.LoraConfig(**lora))
    model.train()
    if recipe.optim is None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)  # a GPU's default
    else:
        optimizer = trainer_optimizer(model, recipe.optim)
        refuse_paged_state(optimizer, recipe.optim)
    if recipe.bf16 or recipe.fp16:
        autocast_forward(torch, model, torch.bfloat16 if recipe.bf16 else torch.float16)
    # accelerate's get_grad_scaler on a CUDA machine: torch.amp.GradScaler("cuda"), at its
    # defaults (a scale of 2**16); the harness scales, steps and updates through it
    scaler = torch.amp.GradScaler("cuda") if recipe.fp16 else None
    return Workload(model, make_inputs, step=lambda model, inputs: model(**inputs).loss,
                    optimizer=optimizer, micro_batches=recipe.gradient_accumulation_steps,
                    scaler=scaler)  # fmt: skip


def load_quantized(torch, transformers, model_class, settings, config, recipe: Recipe):
    """The model as from_pretrained loads it with the recipe's BitsAndBytesConfig onto the
    run's device, from a checkpoint of the model's own tensors, zeros (their values change
    no block), in the run's dtype and on the host as a loaded file's are: each weight is
    moved to the device and, where bitsandbytes replaced its Linear, quantised there."""
    quantization = transformers.BitsAndBytesConfig(**recipe.quantization())
    checkpoint = zeros_checkpoint(torch, model_class, settings, config.dtype)
    return from_checkpoint(transformers, model_class, settings, checkpoint, config.device,
                           config.dtype, quantization)  # fmt: skip


def load_prequantized(torch, transformers, model_class, settings, hf: dict, config):
    """The model as from_pretrained loads a checkpoint bitsandbytes quantized (its config's
    quantization_config): the packed 4-bit weights and their quantisation state, as
    save_pretrained writes them, moved to the device as they are (Bnb4bitDeserialize,
    Params4bit.from_prequantized), nothing quantised there. The checkpoint is made as one
    is saved: the model loaded in 4 bits on the host, with the same BitsAndBytesConfig (read
    by transformers from the config's own fields), its state_dict."""
    plain = transformers.AutoConfig.for_model(
        **{key: value for key, value in hf.items() if key != "quantization_config"}
    )
    quantization = transformers.BitsAndBytesConfig.from_dict(dict(hf["quantization_config"]))
    zeros = zeros_checkpoint(torch, model_class, plain, config.dtype)
    on_host = from_checkpoint(transformers, model_class, plain, zeros, "cpu", config.dtype,
                              quantization)  # fmt: skip
    del zeros
    tied = set(getattr(on_host, "all_tied_weights_keys", None) or ())
    checkpoint = {name: value for name, value in on_host.state_dict().items() if name not in tied}
    del on_host
    return from_checkpoint(transformers, model_class, settings, checkpoint, config.device,
                           config.dtype, None)  # fmt: skip


def zeros_checkpoint(torch, model_class, settings, dtype) -> dict:
    """The model's own tensors, zeros, in `dtype`, on the host as a loaded file's are. Tied
    weights are stored once, as save_pretrained stores them."""
    with contextlib.ExitStack() as stack:  # the skeleton from_pretrained itself builds
        for context in model_class.get_init_context(dtype, False, False, None):
            stack.enter_context(context)
        skeleton = model_class(settings)
    tied = set(getattr(skeleton, "all_tied_weights_keys", None) or ())
    return {
        name: host_zeros(torch, tensor.shape, tensor.dtype)
        for name, tensor in skeleton.state_dict(keep_vars=True).items()
        if name not in tied
    }


def host_zeros(torch, shape, dtype):
    """A checkpoint's tensor on the host, zeros. Zeros, not torch.empty: memory left
    uninitialised can hold NaNs, which change no block but make a float16 GradScaler skip the
    step (seen on a GPU: a QLoRA --fp16 run); a zero model's loss and gradients are finite. A
    trace makes it a fake tensor of the host instead (predicting/quantized_load.py): a
    checkpoint of a 70B model would not fit the host's memory, and its values change no
    block."""
    return torch.zeros(shape, dtype=dtype, device="cpu")


def from_checkpoint(transformers, model_class, settings, checkpoint, device, dtype, quantization):
    """from_pretrained of this state_dict onto `device`, without its report of the weights it
    initialised or a progress bar."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        return model_class.from_pretrained(
            None,
            config=settings,
            state_dict=checkpoint,
            quantization_config=quantization,
            device_map={"": device},
            dtype=dtype,
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()


# bitsandbytes' Optimizer8bit.get_state_buffer: a paged optimizer's state for a tensor of
# this many values or more is made in CUDA unified memory (F.get_paged, cudaMallocManaged);
# below it, with torch.zeros_like as the unpaged optimizer's
PAGED_FROM = 100_000


def refuse_paged_state(optimizer, optim: str) -> None:
    """A paged optimizer whose every parameter is under PAGED_FROM values keeps its state as
    the unpaged one, in blocks of PyTorch's allocator; one with a larger parameter would
    keep that state outside the allocator's counters: refused in one line."""
    if not getattr(optimizer, "is_paged", False):
        return
    large = [
        p.numel() for group in optimizer.param_groups for p in group["params"]
        if p.numel() >= PAGED_FROM
    ]  # fmt: skip
    if large:
        raise cli.UsageError(
            f"--optim {optim}: {len(large)} trained tensors of {PAGED_FROM:,} values or more "
            f"(the largest {max(large):,}) would keep their state in CUDA unified memory "
            "(cudaMallocManaged), which PyTorch's caching allocator does not count: not "
            "modelled; with every trained tensor smaller (LoRA adapters of a low rank), a "
            "paged optimizer keeps its state as the unpaged one and is predicted"
        )


def refuse_bias_casts(torch, model, config, recipe: Recipe) -> None:
    """A 4-bit layer with a bias in another dtype than its compute dtype casts the bias at
    each call, in place (`bias.data = bias.data.to(x.dtype)`, bitsandbytes' Linear4bit).
    Under torch.inference_mode PyTorch refuses that assignment on the meta device, where a
    trace without a GPU runs (a GPU's tensors accept it): refused in one line there."""
    if config.device.type != "meta":
        return
    compute = getattr(torch, recipe.bnb_4bit_compute_dtype)
    biased = any(
        type(module).__name__ == "Linear4bit"
        and module.bias is not None
        and module.bias.dtype != compute
        for module in model.modules()
    )
    if biased:
        said, fix = (
            ("its quantization_config's bnb_4bit_compute_dtype", "--dtype")
            if recipe.prequantized
            else ("--bnb-4bit-compute-dtype", "--bnb-4bit-compute-dtype")
        )
        raise cli.UsageError(
            f"{said} {recipe.bnb_4bit_compute_dtype} on a model in "
            f"{str(config.dtype).removeprefix('torch.')} whose 4-bit layers have biases: "
            "bitsandbytes casts each bias in place at each call, which PyTorch refuses under "
            "inference_mode on the device a trace runs on; not modelled: give the compute "
            f"dtype as {fix}"
        )


def trainer_optimizer(model, optim: str):
    """The optimizer Trainer.create_optimizer makes for TrainingArguments(optim=...): its own
    code, run for a model without a Trainer (it reads the model, the arguments and the two
    methods below only). Its two parameter groups (weight decay for all but biases and
    norms, none for those) are kept: a foreach or fused optimizer runs one kernel sequence
    per group, whose temporaries are the group's."""
    import types

    import transformers

    trainer = transformers.Trainer
    stand_in = types.SimpleNamespace(
        model=model,
        optimizer=None,
        args=trainer_arguments(optim),
        optimizer_cls_and_kwargs=None,
        get_optimizer_cls_and_kwargs=trainer.get_optimizer_cls_and_kwargs,
        get_decay_parameter_names=lambda model: trainer.get_decay_parameter_names(None, model),
    )
    with warnings.catch_warnings():
        # for bitsandbytes' 8-bit optimizers it sums the embeddings' sizes by data_ptr() for
        # its log only: fake tensors warn at data_ptr()
        warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor", UserWarning)
        return trainer.create_optimizer(stand_in)


def autocast_forward(torch, model, dtype) -> None:
    """The model's forward as accelerate runs it for mixed precision
    (Accelerator.prepare_model with native AMP): under torch.autocast on the GPU, and its
    half-precision outputs (a causal LM's logits) copied to float32 after
    (accelerate.utils.convert_outputs_to_fp32), which a GPU holds until the outputs are
    dropped."""
    from accelerate.utils import convert_outputs_to_fp32

    autocast = torch.autocast(device_type="cuda", dtype=dtype)
    model.forward = convert_outputs_to_fp32(autocast(model.forward))


@contextlib.contextmanager
def initialised_as_on_a_gpu(transformers, device):
    """transformers skips weight initialisation under a meta device (to it, meta means "no
    weights wanted": PreTrainedModel.init_weights); on a GPU it runs, with its temporaries.
    The GPU-free trace runs on meta: there, the model is initialised as on a GPU."""
    if device.type != "meta":
        yield
        return
    utils = transformers.modeling_utils
    original = utils.get_torch_context_manager_or_global_device
    utils.get_torch_context_manager_or_global_device = lambda: None
    try:
        yield
    finally:
        utils.get_torch_context_manager_or_global_device = original


def inputs_for(torch, config, model, kind: str, task: str, size: int | None):
    """make_inputs() for the model's kind: `size` token ids (labels = inputs for training),
    or images `size` pixels a side; a classifier's labels are random, as its loss takes them."""
    settings = model.config
    training = task in TRAINED
    device, batch = config.device, config.batch

    def make_inputs() -> dict:
        if kind == "image":
            shape = (batch, settings.num_channels, size, size)
            inputs = {"pixel_values": torch.randn(shape, device=device, dtype=config.dtype)}
        else:
            vocab = settings.get_text_config().vocab_size
            inputs = {"input_ids": torch.randint(0, vocab, (batch, size), device=device)}
        if not training:
            if kind == "seq2seq":
                inputs["decoder_input_ids"] = inputs["input_ids"]
            return inputs
        if kind == "token-classification":
            inputs["labels"] = torch.randint(0, settings.num_labels, (batch, size), device=device)
        elif kind in ("image", "sequence-classification"):
            inputs["labels"] = class_labels(torch, settings, batch, device, config.dtype)
        else:
            inputs["labels"] = inputs["input_ids"]
        return inputs

    return make_inputs


def class_labels(torch, settings, batch: int, device, dtype):
    """One label a row, of the kind the head's loss takes (transformers' rule, from
    problem_type, else num_labels): a value for a regression (one label), a 0/1 target
    per class for multi-label classification, else a class index. Multi-label targets in
    float32, as a data collator makes them from Python numbers; a regression's values in the
    model's dtype, as a user must cast them: up to PyTorch 2.11 at least, mse_loss's backward
    on a GPU refuses a target of another dtype than its input (a bfloat16 reward model's
    float32 labels raise RuntimeError in backward; pytorch/pytorch#36553)."""
    problem = settings.problem_type or ("regression" if settings.num_labels == 1 else None)
    if problem == "regression":
        return torch.randn((batch,), device=device, dtype=dtype)
    if problem == "multi_label_classification":
        return torch.randint(0, 2, (batch, settings.num_labels), device=device).float()
    return torch.randint(0, settings.num_labels, (batch,), device=device)


def learned_positions(torch, model) -> int | None:
    """The positions a learned (or tabled) absolute position embedding holds, None where the
    model has none: rotary, relative and ALiBi positions have no table to run past. GPT-2's
    `wpe`, BERT's `position_embeddings`; OPT's and BART's count from an offset of 2,
    RoBERTa's after its padding index."""
    limits = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Embedding) and ("position" in leaf or leaf == "wpe"):
            usable = module.num_embeddings - getattr(module, "offset", 0)
            if module.padding_idx is not None:
                usable -= module.padding_idx + 1
            limits.append(usable)
    return min(limits, default=None)


def greedy(torch, new_tokens: int):
    """generate()'s greedy loop: a prefill keeping the last position's logits, then one token
    at a time through the model's DynamicCache; the prompt and the new tokens returned.
    generate() itself stops on values (`unfinished_sequences.max() == 0`), which a fake
    tensor does not have: all `new_tokens` are generated, as with min_new_tokens."""

    def step(model, inputs):
        import transformers

        keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        with torch.inference_mode():
            cache = transformers.DynamicCache(config=model.config)
            extra = {"logits_to_keep": 1} if keep else {}
            tokens = [inputs["input_ids"]]
            for n in range(new_tokens):
                if n == 0:
                    out = model(**inputs, past_key_values=cache, use_cache=True, **extra)
                else:
                    out = model(input_ids=tokens[-1], past_key_values=cache, use_cache=True)
                # as generate(): the last logits copied in float32, the output dropped
                logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
                del out
                tokens.append(logits.argmax(-1, keepdim=True))
            return torch.cat(tokens, dim=1)

    return step
