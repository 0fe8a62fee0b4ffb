"""Policies as Hugging Face model directories: check one, load it, export one.

A policy directory is what transformers' `save_pretrained` writes for a Qwen3ForCausalLM, a
Qwen3VLForConditionalGeneration, a Qwen3_5ForConditionalGeneration or a Qwen3_5ForCausalLM, plus
the policy's tokenizer (with its chat template) and image processor: config.json, safetensors
weights (model.safetensors, or shards listed by model.safetensors.index.json), tokenizer.json /
tokenizer_config.json / chat_template.jinja and preprocessor_config.json. The same directory
loads in transformers, in vLLM and here.

* `check_policy_directory` validates a directory before any weight is read, with errors naming
  the file and field at fault;
* `load_policy` checks, then loads it as our `Qwen3ForCausalLM`, `Qwen3VLForConditionalGeneration`
  or Qwen3.5 (`cua_jax.models.qwen3_5`);
* `export_policy` writes one of ours with the policy's own tokenizer, chat template and image
  processor, which `cua_jax.context.tokenizer.load_processor` reads back unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax

from cua_jax.models.checkpoint import INDEX_FILE, SINGLE_FILE
from cua_jax.models.registry import MODEL_KINDS, model_kind_of

# config.json `architectures` entry -> policy kind (which is also the config's `model_type`).
SUPPORTED_ARCHITECTURES: dict[str, str] = {kind.architecture: kind.name for kind in MODEL_KINDS.values()}
_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json")


@dataclasses.dataclass(frozen=True)
class PolicyDirectory:
    """What `check_policy_directory` found in a valid policy directory.

    kind: "qwen3" or "qwen3_vl"; architecture: the config's class name for it.
    vocab_size: the model's vocabulary (config.json's vocab_size, text_config.vocab_size for Qwen3-VL).
    safetensors: the weight files, in name order.
    tokenizer_size: the ids the directory's tokenizer produces (its largest id + 1); None when
      the directory holds no tokenizer files.
    has_processor: the directory holds an image processor (preprocessor_config.json).
    """

    directory: pathlib.Path
    kind: str
    architecture: str
    vocab_size: int
    safetensors: tuple[str, ...]
    tokenizer_size: int | None
    has_processor: bool

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer_size is not None


def token_id_bound(tokenizer) -> int:
    """The number of ids `tokenizer` can produce: its largest token id + 1 (what the model's
    embedding table must hold)."""
    return max(tokenizer.get_vocab().values()) + 1


def _read_config(config_file: pathlib.Path) -> dict[str, Any]:
    if not config_file.is_file():
        raise ValueError(f"{config_file} is missing: a policy directory needs the model's config.json")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{config_file} is unreadable: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} holds {type(config).__name__}, not a JSON object")
    return config


def _policy_kind(config: dict[str, Any], config_file: pathlib.Path) -> tuple[str, str]:
    """(kind, architecture) from the config's `architectures`, else its `model_type`."""
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    architectures = config.get("architectures")
    model_type = config.get("model_type")
    if architectures:
        if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
            raise ValueError(
                f"{config_file}: field `architectures` must be a list of class names, got {architectures!r}"
            )
        known = [name for name in architectures if name in SUPPORTED_ARCHITECTURES]
        if len(known) != 1:
            raise ValueError(f"{config_file}: field `architectures` is {architectures!r}; supported: {supported}")
        architecture = known[0]
        kind = SUPPORTED_ARCHITECTURES[architecture]
        if model_type is not None and model_type != kind:
            raise ValueError(
                f"{config_file}: field `model_type` is {model_type!r}, but field `architectures` "
                f"names {architecture}, whose model_type is {kind!r}"
            )
        return kind, architecture
    if model_type in MODEL_KINDS:
        return model_type, MODEL_KINDS[model_type].architecture
    raise ValueError(
        f"{config_file}: no field `architectures`, and field `model_type` ({model_type!r}) names no "
        f"supported model; supported architectures: {supported}"
    )


def _vocab_size(config: dict[str, Any], kind: str, config_file: pathlib.Path) -> tuple[str, int]:
    """(dotted field name, value) of the model's vocabulary size."""
    path = MODEL_KINDS[kind].vocab_field
    value: Any = config
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    field = ".".join(path)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{config_file}: field `{field}` must be a positive integer, got {value!r}")
    return field, value


def _safetensors_files(directory: pathlib.Path) -> tuple[str, ...]:
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
            raise ValueError(f"{index} is unreadable: {error}") from None
        if (
            not isinstance(weight_map, dict)
            or not weight_map
            or not all(isinstance(f, str) for f in weight_map.values())
        ):
            raise ValueError(
                f"{index}: field `weight_map` must map tensor names to shard file names, got {weight_map!r:.200}"
            )
        shards = tuple(sorted(set(weight_map.values())))
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            raise ValueError(f"{index}: field `weight_map` names shard files missing from {directory}: {missing}")
        return shards
    if (directory / SINGLE_FILE).is_file():
        return (SINGLE_FILE,)
    others = sorted(name for name in os.listdir(directory) if name.endswith((".bin", ".pt", ".pth", ".safetensors")))
    found = f"; it has {others}" if others else ""
    raise ValueError(f"{directory} holds no safetensors weights (neither {SINGLE_FILE} nor {INDEX_FILE}){found}")


def _tokenizer_size(directory: pathlib.Path) -> int | None:
    if not any((directory / name).is_file() for name in _TOKENIZER_MARKERS):
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception as error:  # transformers raises many kinds for broken tokenizer files
        raise ValueError(f"the tokenizer files in {directory} do not load: {type(error).__name__}: {error}") from error
    return token_id_bound(tokenizer)


def check_policy_directory(directory: str | os.PathLike) -> PolicyDirectory:
    """Validates a policy directory without reading its weights; raises ValueError naming the
    file and field at fault: not a directory, a missing or unreadable config.json, an
    unsupported architecture, no safetensors weights, a shard the index names but the directory
    lacks, or a tokenizer producing ids past the config's vocabulary."""
    path = pathlib.Path(directory)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    config_file = path / "config.json"
    config = _read_config(config_file)
    kind, architecture = _policy_kind(config, config_file)
    vocab_field, vocab_size = _vocab_size(config, kind, config_file)
    safetensors = _safetensors_files(path)
    tokenizer_size = _tokenizer_size(path)
    if tokenizer_size is not None and tokenizer_size > vocab_size:
        tokenizer_file = next(path / name for name in _TOKENIZER_MARKERS if (path / name).is_file())
        raise ValueError(
            f"{tokenizer_file}: the tokenizer produces ids up to {tokenizer_size - 1}, past the model's "
            f"vocabulary: field `{vocab_field}` of {config_file} is {vocab_size}"
        )
    return PolicyDirectory(
        path, kind, architecture, vocab_size, safetensors, tokenizer_size, (path / "preprocessor_config.json").is_file()
    )


def load_policy(directory: str | os.PathLike, **overrides):
    """(model, kind) for the policy directory, loaded by its kind's `MODEL_KINDS` entry: kind
    "qwen3" gives our Qwen3ForCausalLM (`qwen3.load_qwen3`), "qwen3_vl" our
    Qwen3VLForConditionalGeneration (`qwen3_vl.load_qwen3_vl`), "qwen3_5" / "qwen3_5_text" our
    Qwen3.5 (`qwen3_5.load_qwen3_5`).
    The directory is checked first (`check_policy_directory`); overrides go to the loader (mesh,
    rules, dtype, param_dtype, freeze_vision for Qwen3-VL)."""
    policy = check_policy_directory(directory)
    model, _ = MODEL_KINDS[policy.kind].load(directory, **overrides)
    return model, policy.kind


def policy_kind(model) -> str:
    """The kind (a `MODEL_KINDS` name: "qwen3", "qwen3_vl", "qwen3_5", "qwen3_5_text") of one of our
    models; TypeError for anything else."""
    try:
        return model_kind_of(model).name
    except TypeError as error:
        raise TypeError(f"cannot export a {type(model).__name__}: {error}") from None


def export_policy(
    model,
    directory: str | os.PathLike,
    *,
    tokenizer,
    image_processor=None,
    chat_template: str | None = None,
    dtype: str | None = None,
    local: bool = False,
) -> PolicyDirectory | None:
    """Writes `model` (our Qwen3ForCausalLM or Qwen3VLForConditionalGeneration) as a policy
    directory with the policy's own tokenizer files, chat template and image processor.

    tokenizer: a transformers tokenizer, or a directory whose tokenizer files (and processor
      files, unless `image_processor` is given) are copied byte for byte.
    image_processor: default the one `load_processor(tokenizer)` gives for a directory (its
      preprocessor_config.json copied, else the default small-screen processor); the default
      small-screen processor for a tokenizer object.
    chat_template: replaces the tokenizer's chat template.
    dtype: the weights' on-disk dtype (e.g. "bfloat16"); default each parameter's own.
    local: this process writes the whole directory from its own copy of the model (every
      parameter addressable here), whatever its index; by default the parameters are gathered
      across processes and process 0 writes.

    The tokenizer is checked against the model's vocabulary before anything is written.
    Returns the written directory's `check_policy_directory` on the writing process (process 0,
    or this one when `local`), None on the others.
    """
    kind = policy_kind(model)
    if tokenizer is None:
        raise ValueError(
            "export_policy needs the policy's tokenizer: a transformers tokenizer or a directory holding its files"
        )
    if isinstance(tokenizer, (str, os.PathLike)):
        source = pathlib.Path(tokenizer)
        if not any((source / name).is_file() for name in _TOKENIZER_MARKERS):
            raise ValueError(f"no tokenizer files ({' / '.join(_TOKENIZER_MARKERS)}) in {source}")
        size = _tokenizer_size(source)
        where = f"the tokenizer in {source}"
    else:
        size = token_id_bound(tokenizer)
        where = f"the tokenizer ({type(tokenizer).__name__})"
    text_only = MODEL_KINDS[kind].text_only
    vocab_size = model.config.vocab_size if text_only else model.config.text.vocab_size
    if size > vocab_size:
        field = "vocab_size" if text_only else "text.vocab_size"
        raise ValueError(
            f"{where} produces ids up to {size - 1}, past the model's vocabulary (its config's {field} is {vocab_size})"
        )
    MODEL_KINDS[kind].export(
        model,
        directory,
        dtype=dtype,
        tokenizer=tokenizer,
        image_processor=image_processor,
        chat_template=chat_template,
        local=local,
    )
    return check_policy_directory(directory) if local or jax.process_index() == 0 else None
