"""Hugging Face safetensors checkpoints in and out of NNX models.

Loading never materialises the whole model on the host: the model is built abstractly
(`nnx.eval_shape`), every safetensors file is memory-mapped, and each parameter is
assembled with `jax.make_array_from_callback`, which reads only the slice each device
holds under the parameter's target sharding. Exporting streams one tensor at a time
from the devices into the file.

The link between the two namings is one key table per model: a list of `KeyRule`s
(HF key template, NNX path template, transpose?) expanded over placeholders such as
`{layer}`. The same table drives both directions, so load(export(m)) == m by construction.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from cua_jax.context.tokenizer import save_tokenizer_and_processor
from cua_jax.models.sharding import DEFAULT_RULES, state_shardings

SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_DTYPE_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


# ---------------------------------------------------------------------------------------
# Key tables


@dataclasses.dataclass(frozen=True)
class KeyRule:
    """One HF tensor <-> one NNX parameter.

    hf / ours: templates with `{name}` placeholders (e.g. `{layer}`) filled from the
    counts given to `expand_key_table`; `ours` is the dotted NNX state path
    ("model.layers.0.self_attn.q_proj.kernel"). transpose: the HF tensor is the 2-D
    transpose of ours (torch Linear weight [out, in] vs our kernel [in, out]).
    """

    hf: str
    ours: str
    transpose: bool = False


@dataclasses.dataclass(frozen=True)
class KeyMapping:
    """A `KeyRule` with its placeholders filled in."""

    hf: str
    path: tuple[str | int, ...]
    transpose: bool


def _parse_path(dotted: str) -> tuple[str | int, ...]:
    return tuple(int(p) if p.isdigit() else p for p in dotted.split("."))


def expand_key_table(rules: Iterable[KeyRule], counts: Mapping[str, int]) -> list[KeyMapping]:
    """Fills each rule's placeholders with every index in range(counts[name]).

    A rule may use at most one placeholder (the common case: one per layer stack).
    """
    out: list[KeyMapping] = []
    for rule in rules:
        names = set(re.findall(r"{(\w+)}", rule.hf)) | set(re.findall(r"{(\w+)}", rule.ours))
        if len(names) > 1:
            raise ValueError(f"key rule {rule} uses several placeholders {sorted(names)}")
        if not names:
            out.append(KeyMapping(rule.hf, _parse_path(rule.ours), rule.transpose))
            continue
        (name,) = names
        if name not in counts:
            raise KeyError(f"key rule {rule} needs a count for placeholder {{{name}}}")
        for i in range(counts[name]):
            fill = {name: i}
            out.append(KeyMapping(rule.hf.format(**fill), _parse_path(rule.ours.format(**fill)), rule.transpose))
    hf_keys = [m.hf for m in out]
    if len(set(hf_keys)) != len(hf_keys):
        raise ValueError("key table maps some HF key twice")
    return out


# ---------------------------------------------------------------------------------------
# safetensors files (memory-mapped reads, streamed writes)


class SafetensorsFile:
    """A memory-mapped safetensors file: `array(key)` is a read-only np.memmap view, so
    slicing it reads only the bytes of the slice."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        with open(self.path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            try:
                header = json.loads(f.read(header_len))
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path} is not a safetensors file (bad header: {e})") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self._entries = header
        self._data_start = 8 + header_len

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entries[key]["shape"])

    def array(self, key: str) -> np.ndarray:
        entry = self._entries[key]
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{self.path}: tensor {key!r} has unsupported dtype {entry['dtype']}")
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - begin != int(np.prod(shape)) * dtype.itemsize:
            raise ValueError(f"{self.path}: tensor {key!r} byte range does not match its shape {shape}")
        if end == begin:
            return np.zeros(shape, dtype)
        return np.memmap(self.path, dtype=dtype, mode="r", offset=self._data_start + begin, shape=shape)


def open_checkpoint(directory: str | os.PathLike) -> dict[str, SafetensorsFile]:
    """HF key -> the file holding it, for a single-file or index-sharded checkpoint."""
    directory = pathlib.Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: SafetensorsFile(directory / name) for name in sorted(set(weight_map.values()))}
        return {key: files[name] for key, name in weight_map.items()}
    single = directory / SINGLE_FILE
    if single.is_file():
        f = SafetensorsFile(single)
        return {key: f for key in f.keys()}
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {directory}")


def _write_safetensors(
    path: pathlib.Path, entries: list[tuple[str, tuple[int, ...], np.dtype, Callable[[], np.ndarray]]]
) -> int:
    """Writes tensors produced one at a time by their callables; returns bytes of data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, shape, dtype, _ in entries:
        size = int(np.prod(shape)) * dtype.itemsize
        header[key] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # 8-byte alignment of the data section
    with open(path, "wb") as f:
        f.write(len(header_bytes).to_bytes(8, "little"))
        f.write(header_bytes)
        for key, shape, dtype, produce in entries:
            array = np.ascontiguousarray(produce(), dtype=dtype)
            if array.shape != tuple(shape):
                raise ValueError(f"tensor {key!r} produced shape {array.shape}, expected {shape}")
            f.write(array.tobytes())
    return offset


# ---------------------------------------------------------------------------------------
# load


def _variables_by_path(state: nnx.State) -> dict[tuple, nnx.Variable]:
    return {tuple(path): var for path, var in nnx.to_flat_state(state)}


def load_hf_checkpoint(
    directory: str | os.PathLike,
    model_fn: Callable[[], nnx.Module],
    key_table: Sequence[KeyMapping],
    *,
    mesh: Mesh | None = None,
    rules: Mapping[str, Any] = DEFAULT_RULES,
    ignore_hf_keys: Callable[[str], bool] = lambda key: False,
) -> nnx.Module:
    """The model `model_fn()` builds, with its parameters read from the HF checkpoint in
    `directory` and placed on their shardings over `mesh` (default: the first device).

    Every model parameter must be in the table and the checkpoint, and every checkpoint
    tensor must be in the table unless `ignore_hf_keys(key)`; shapes must match. Values
    are cast to each parameter's declared dtype.
    """
    files = open_checkpoint(directory)
    abstract = nnx.eval_shape(model_fn)
    graphdef, abstract_state = nnx.split(abstract)
    variables = _variables_by_path(abstract_state)
    if mesh is not None:
        shardings = _variables_by_path(state_shardings(abstract_state, mesh, rules))
    else:
        device = SingleDeviceSharding(jax.devices()[0])
        shardings = {path: device for path in variables}

    by_path = {m.path: m for m in key_table}
    unmapped = [".".join(map(str, p)) for p in variables if p not in by_path]
    if unmapped:
        raise KeyError(f"model parameters missing from the key table: {unmapped[:10]}")
    stale = [m.hf for m in key_table if m.path not in variables]
    if stale:
        raise KeyError(f"key table names parameters the model does not have: {stale[:10]}")
    missing = [m.hf for m in key_table if m.hf not in files]
    if missing:
        raise KeyError(f"checkpoint {directory} lacks tensors: {missing[:10]}")
    extra = [k for k in files if k not in {m.hf for m in key_table} and not ignore_hf_keys(k)]
    if extra:
        raise KeyError(f"checkpoint {directory} has tensors the key table does not map: {extra[:10]}")

    loaded = {}
    for path, var in variables.items():
        mapping = by_path[path]
        source = files[mapping.hf].array(mapping.hf)
        view = source.T if mapping.transpose else source
        if view.shape != tuple(var.shape):
            raise ValueError(
                f"{mapping.hf}: checkpoint shape {source.shape} does not fit parameter "
                f"{'.'.join(map(str, path))} of shape {tuple(var.shape)} (transpose={mapping.transpose})"
            )
        dtype = var.dtype

        def read(index, view=view, dtype=dtype):
            return np.asarray(view[index], dtype=dtype)

        loaded[path] = jax.make_array_from_callback(tuple(var.shape), shardings[path], read)
    for path, var in variables.items():
        var.set_value(loaded[path])
    return nnx.merge(graphdef, abstract_state)


def read_hf_config(directory: str | os.PathLike) -> dict[str, Any]:
    path = pathlib.Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {directory}")
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------
# export


def _to_host(array: jax.Array | np.ndarray) -> np.ndarray:
    if not isinstance(array, jax.Array) or array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def export_hf_checkpoint(
    model: nnx.Module,
    directory: str | os.PathLike,
    key_table: Sequence[KeyMapping],
    hf_config: Mapping[str, Any],
    *,
    dtype: str | np.dtype | None = None,
    max_shard_bytes: int = 4 * 1024**3,
    tokenizer_files: bool = True,
    tokenizer=None,
    image_processor=None,
    chat_template: str | None = None,
    local: bool = False,
) -> pathlib.Path:
    """Writes `model` as a HF directory: config.json, safetensors (sharded with an index
    past `max_shard_bytes`), and tokenizer + processor files.

    dtype: the tensors' on-disk dtype (e.g. "bfloat16"); default each parameter's own.
    tokenizer / image_processor / chat_template: written by
    `cua_jax.context.tokenizer.save_tokenizer_and_processor` (a tokenizer object or a directory
    to copy the files from; its defaults, the shipped tokenizer and the default processor, when
    None; `cua_jax.models.hf_policy.export_policy` always names the policy's own);
    tokenizer_files=False skips them.
    Tensors travel to the host one at a time (gathered across hosts when sharded over
    several); only process 0 writes files, unless `local`: this process writes them from its
    own copy of the model (every parameter addressable here; no collective).
    """
    directory = pathlib.Path(directory)
    variables = _variables_by_path(nnx.state(model))
    entries = []
    for mapping in key_table:
        if mapping.path not in variables:
            raise KeyError(f"key table names parameter {'.'.join(map(str, mapping.path))}, absent from the model")
        var = variables[mapping.path]
        shape = tuple(var.shape[::-1]) if mapping.transpose else tuple(var.shape)
        out_dtype = (
            np.dtype(ml_dtypes.bfloat16 if dtype in ("bfloat16", "bf16") else dtype) if dtype else np.dtype(var.dtype)
        )

        def produce(var=var, transpose=mapping.transpose):
            host = _to_host(var[...])
            return host.T if transpose else host

        entries.append((mapping.hf, shape, out_dtype, produce))
    unmapped = [".".join(map(str, p)) for p in variables if p not in {m.path for m in key_table}]
    if unmapped:
        raise KeyError(f"model parameters missing from the key table (they would be lost): {unmapped[:10]}")

    shards: list[list] = [[]]
    size = 0
    for entry in entries:
        nbytes = int(np.prod(entry[1])) * entry[2].itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes

    writer = local or jax.process_index() == 0
    if writer:
        directory.mkdir(parents=True, exist_ok=True)
        config = dict(hf_config)
        if dtype:
            config["dtype"] = "bfloat16" if dtype in ("bfloat16", "bf16") else str(np.dtype(dtype))
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    total = 0
    weight_map = {}
    for name, shard in zip(names, shards):
        if writer:
            total += _write_safetensors(directory / name, shard)
        else:  # other hosts take part in the gathers
            for entry in shard:
                entry[3]()
        weight_map.update({entry[0]: name for entry in shard})
    if writer and len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    if writer and tokenizer_files:
        save_tokenizer_and_processor(
            directory, tokenizer=tokenizer, image_processor=image_processor, chat_template=chat_template
        )
    return directory
