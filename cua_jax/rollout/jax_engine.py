"""The built-in JAX sampler behind the rollout-engine interface.

`cua_jax.models.sampler.Sampler` already follows the engine's logprob convention
(renormalised top-k / top-p distribution at the sampling temperature; plain model
distribution for greedy), so this adapter only translates requests, keys and versions.
Images (Qwen3-VL) go through the model directory's image processor and the VL model's
prefill extras.

`JaxEngineFactory` builds the engine from picklable parts (model class, config, host
parameters), so a Ray actor can build its own copy in its own process.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cua_jax.context.tokenizer import image_grid_thw, load_processor
from cua_jax.models.qwen3 import rope_scaled_model
from cua_jax.models.qwen3_vl import rope_index
from cua_jax.models.sampler import (
    PrefixCache,
    PromptImage,
    PromptInput,
    Sampler,
    SamplingParams,
    image_runs,
    normalized_token_ids,
)
from cua_jax.models.vision import image_content_key
from cua_jax.observe import timeline
from cua_jax.rollout.engine import (
    EngineHealth,
    FinishReason,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
)

# Processed screenshots kept by content (a screenshot is processed again only once evicted).
_PROCESSED_IMAGES = 64


class JaxSamplerEngine(RolloutEngine):
    """Generation with an in-process NNX model.

    model: a `DecoderLM` (Qwen3ForCausalLM, Qwen3VLForConditionalGeneration).
    seed: base of the PRNG stream; calls without `SamplingConfig.seed` fold in a
    call counter, so successive calls draw fresh randomness. The counter is the engine's
    sampling state (`sampling_state` / `load_sampling_state`): a resumed run restores it
    and samples what the uninterrupted run would have.
    image_processor: needed only for requests with images (VL models).
    banned_token_ids: ids never sampled (`SamplingParams.banned_token_ids`): pass
    `agent_loop.reserved_token_ids(renderer)` so no reply holds a vision placeholder, and
    the same ids to the learner (`LearnerConfig.banned_token_ids`) so its logprobs match.
    interrupt_tokens: 0, a weight update waits for the generation in flight; N > 0, replies
    longer than N grow N tokens at a time and an update lands between chunks (partial
    rollouts, `_generate_in_chunks`), each token tagged with its version.
    share_prompts: the part of a batch's prompts that several share (a group's first prompt)
    is prefilled once and its screenshots encoded once (`Sampler.sample`).
    prefix_cache_tokens: > 0 keeps each reply's prompt + reply keys and values (at most this
    many cache slots over all), so an episode's next turn prefills only its new tokens; the
    cache is dropped whenever the weights change. 0: every prompt is prefilled whole.
    sampler_kwargs go to the `Sampler` (buckets, cache dtype, pad id, shared_prefix_attention:
    rows continuing one cached prefix attend it held once).

    A call whose `SamplingConfig.rope_scaling` is set samples from a view of the model under
    YaRN at that factor (`qwen3.rope_scaled_model`, built on first use): the same parameter
    arrays, kept in step by every weight update, with a prefix cache of its own (its keys
    rotate otherwise). The model itself, and every other call, keep the model's own rope.
    """

    def __init__(
        self,
        model: nnx.Module,
        *,
        seed: int = 0,
        image_processor: Any = None,
        initial_version: int = 0,
        banned_token_ids: Sequence[int] = (),
        interrupt_tokens: int = 0,
        share_prompts: bool = False,
        prefix_cache_tokens: int = 0,
        **sampler_kwargs: Any,
    ):
        if interrupt_tokens < 0:
            raise ValueError(f"interrupt_tokens must be >= 0, got {interrupt_tokens}")
        if prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        self.interrupt_tokens = int(interrupt_tokens)
        self._sampler_kwargs = dict(sampler_kwargs)
        self._sampler = Sampler(model, **sampler_kwargs)
        self.banned_token_ids = normalized_token_ids(banned_token_ids, "banned_token_ids")
        self.share_prompts = bool(share_prompts)
        self._prefix_cache_tokens = int(prefix_cache_tokens)
        self._prefix_cache = self._new_prefix_cache()
        # rope_scaling factor -> (sampler over the YaRN view of the model, its prefix cache).
        self._scaled: dict[float, tuple[Sampler, PrefixCache | None]] = {}
        self._base_key = jax.random.key(seed)
        self._calls = 0
        self._image_processor = image_processor
        # The latest screenshots through the image processor, by content.
        self._processed: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()
        self._version = initial_version
        self._lock = threading.Lock()
        # Weight updates announce themselves before taking the lock, so a chunked generation
        # lets them in at its next chunk boundary (`_yield_to_updates`).
        self._updated = threading.Condition(self._lock)
        self._updates_waiting = 0
        self._intent = threading.Lock()

    @property
    def model(self) -> nnx.Module:
        return self._sampler.model

    @property
    def scaled_models(self) -> dict[float, nnx.Module]:
        """The YaRN views of the model built so far (class doc), by rope_scaling factor."""
        with self._lock:
            return {factor: sampler.model for factor, (sampler, _) in self._scaled.items()}

    def _new_prefix_cache(self) -> PrefixCache | None:
        if not self._prefix_cache_tokens:
            return None
        return PrefixCache(self._prefix_cache_tokens, exact=self._sampler.recurrent)

    def _sampler_for(self, rope_scaling: float) -> tuple[Sampler, PrefixCache | None]:
        """The sampler and prefix cache of calls at `rope_scaling` (under the lock)."""
        if not rope_scaling:
            return self._sampler, self._prefix_cache
        factor = float(rope_scaling)
        if factor not in self._scaled:
            self._scaled[factor] = (
                Sampler(rope_scaled_model(self.model, factor), **self._sampler_kwargs),
                self._new_prefix_cache(),
            )
        return self._scaled[factor]

    def stats(self) -> dict[str, int]:
        """The samplers' work so far (`Sampler.stats`: prompts, prompt / cached / prefilled /
        generated tokens, images requested and encoded, ...) and the prefix caches' size."""
        with self._lock:
            out: collections.Counter = collections.Counter()
            samplers = [(self._sampler, self._prefix_cache), *self._scaled.values()]
            for sampler, cache in samplers:
                out.update(sampler.stats)
                if cache is not None:
                    out["cache_entries"] += len(cache.entries)
                    out["cache_slots"] += cache.slots
            return dict(out)

    # -- prompts -----------------------------------------------------------------------------

    def _patches(self, key: bytes, image: np.ndarray) -> np.ndarray:
        """A screenshot's patches through the image processor, memoised by content (a screenshot
        is encoded again when a prompt's cached part no longer holds it)."""
        hit = self._processed.get(key)
        if hit is not None:
            self._processed.move_to_end(key)
            return hit
        processed = self._image_processor(images=[image], return_tensors="np")
        hit = self._processed[key] = np.asarray(processed["pixel_values"], np.float32)
        while len(self._processed) > _PROCESSED_IMAGES:
            self._processed.popitem(last=False)
        return hit

    def _prompt_input(self, request: GenerationRequest) -> PromptInput:
        """The sampler's view of a request: ids, multimodal positions, images with content keys
        (the patches are computed only for images the sampler has to encode)."""
        if not request.images:
            return PromptInput(request.prompt_ids)
        model = self.model
        if not hasattr(model, "encode_images"):
            raise ValueError(f"{type(model).__name__} is text-only; the requests carry images")
        if self._image_processor is None:
            raise ValueError("requests carry images but the engine has no image_processor")

        config = model.config
        ids = request.prompt_ids
        runs = image_runs(ids, config.image_token_id)
        if len(runs) != len(request.images):
            raise ValueError(f"the prompt holds {len(runs)} image placeholder runs for {len(request.images)} images")
        images = []
        for image, (start, end) in zip(request.images, runs):
            array = np.ascontiguousarray(image)
            key = image_content_key(array)
            grid = image_grid_thw(self._image_processor, *array.shape[:2])
            images.append(PromptImage(start, end, grid, key, functools.partial(self._patches, key, array)))
        positions, _ = rope_index(
            ids[None],
            [im.grid for im in images],
            image_token_id=config.image_token_id,
            spatial_merge_size=config.vision.spatial_merge_size,
        )
        return PromptInput(ids, positions[:, 0], tuple(images))

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        if not requests:
            return []
        params = SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            max_new_tokens=sampling.max_new_tokens,
            stop_token_ids=tuple(int(t) for t in sampling.stop_token_ids),
            banned_token_ids=self.banned_token_ids,
        )
        if self.interrupt_tokens and sampling.max_new_tokens > self.interrupt_tokens:
            return self._generate_in_chunks(requests, sampling, params)
        with self._lock:
            key = self._call_key(sampling)
            version = self._version
            seeds = [r.seed for r in requests]
            out = self._sample(
                requests, params, key, None if all(s is None for s in seeds) else seeds, sampling.rope_scaling
            )
        return [
            Generation(
                token_ids=np.asarray(tokens, np.int32),
                logprobs=np.asarray(logprobs, np.float32),
                finish_reason=FinishReason(reason),
                policy_version=version,
            )
            for tokens, logprobs, reason in zip(out.tokens, out.logprobs, out.finish_reasons)
        ]

    def _sample(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
        key: jax.Array,
        seeds,
        rope_scaling: float = 0.0,
    ):
        """The output for `requests` (under the lock) of the sampler at `rope_scaling`, with the
        engine's prompt sharing and that sampler's prefix cache."""
        sampler, cache = self._sampler_for(rope_scaling)
        with timeline.span("engine_host"):
            prompts = [self._prompt_input(r) for r in requests]
            return sampler.sample(prompts, params, key, row_seeds=seeds, cache=cache, share_prompts=self.share_prompts)

    def _call_key(self, sampling: SamplingConfig) -> jax.Array:
        """The call's key: its seed's, else the next of the engine's stream (under the lock)."""
        if sampling.seed is not None:
            return jax.random.key(sampling.seed)
        key = jax.random.fold_in(self._base_key, self._calls)
        self._calls += 1
        return key

    def _generate_in_chunks(
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig, params: SamplingParams
    ) -> list[Generation]:
        """Partial rollouts: the replies grow interrupt_tokens at a time; between chunks a
        waiting weight update lands, and the next chunk continues each unfinished reply under
        the new weights from its prompt plus the tokens so far (the KV cache recomputed by the
        prefill). Every token is tagged with the version that produced it. Chunk c samples
        with fold_in(call key, c) (a request's own seed s: key((s * 1000003 + c) mod 2**31))."""
        n = len(requests)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        versions: list[list[int]] = [[] for _ in range(n)]
        finish: list[FinishReason | None] = [None] * n
        with self._lock:
            key = self._call_key(sampling)
        chunk = 0
        while True:
            active = [i for i in range(n) if finish[i] is None]
            if not active:
                break
            budget = min(self.interrupt_tokens, sampling.max_new_tokens - len(tokens[active[0]]))
            continuing = [
                GenerationRequest(
                    np.concatenate([requests[i].prompt_ids, np.asarray(tokens[i], np.int32)]),
                    requests[i].images,
                    requests[i].seed,
                )
                for i in active
            ]
            seeds = [None if r.seed is None else (int(r.seed) * 1_000_003 + chunk) % 2**31 for r in continuing]
            with self._lock:
                version = self._version
                out = self._sample(
                    continuing,
                    dataclasses.replace(params, max_new_tokens=budget),
                    jax.random.fold_in(key, chunk),
                    None if all(s is None for s in seeds) else seeds,
                    sampling.rope_scaling,
                )
            for row, i in enumerate(active):
                tokens[i] += [int(t) for t in out.tokens[row]]
                logprobs[i] += [float(x) for x in out.logprobs[row]]
                versions[i] += [version] * len(out.tokens[row])
                if FinishReason(out.finish_reasons[row]) is FinishReason.STOP:
                    finish[i] = FinishReason.STOP
                elif len(tokens[i]) >= sampling.max_new_tokens:
                    finish[i] = FinishReason.LENGTH
            chunk += 1
            self._yield_to_updates()
        return [
            Generation(
                np.asarray(tokens[i], np.int32),
                np.asarray(logprobs[i], np.float32),
                finish[i],
                min(versions[i], default=self._version),
                np.asarray(versions[i], np.int32),
            )
            for i in range(n)
        ]

    def _yield_to_updates(self) -> None:
        """A chunk boundary: waits while a weight update is waiting to land."""
        with self._updated:
            while self._updates_waiting:
                self._updated.wait()

    def update_weights(self, params: Any, version: int) -> None:
        """params: an NNX module of the same architecture, or its `nnx.State`; host (numpy)
        leaves, as a Ray actor receives them, are moved to the default device. With
        interrupt_tokens, a generation in flight takes the new weights at its next chunk."""
        state = params if isinstance(params, nnx.State) else nnx.state(params)
        with self._intent:
            self._updates_waiting += 1
        with self._updated:
            nnx.update(self.model, _on_device(state))
            current = nnx.state(self.model)
            for sampler, _ in self._scaled.values():  # the YaRN views take the same arrays
                nnx.update(sampler.model, current)
            self._version = version
            for cache in [self._prefix_cache] + [cache for _, cache in self._scaled.values()]:
                if cache is not None:  # keys and values of the old weights
                    cache.clear()
            with self._intent:
                self._updates_waiting -= 1
            self._updated.notify_all()

    def sampling_state(self) -> dict[str, int]:
        """{"calls": unseeded generate calls so far} (folded into the base key)."""
        with self._lock:
            return {"calls": self._calls}

    def load_sampling_state(self, state: Mapping[str, int]) -> None:
        """Continues the PRNG stream from a `sampling_state()`."""
        if set(state) != {"calls"} or int(state["calls"]) < 0:
            raise ValueError(f"a JAX engine's sampling state is {{'calls': count >= 0}}, got {dict(state)}")
        with self._lock:
            self._calls = int(state["calls"])

    def health(self) -> EngineHealth:
        return EngineHealth(healthy=True, policy_version=self._version)


def _on_device(state: nnx.State) -> nnx.State:
    """`state` with its host (numpy) leaves moved to the default device."""
    return jax.tree.map(lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, state)


@dataclasses.dataclass(frozen=True)
class JaxEngineFactory:
    """Builds a `JaxSamplerEngine` in the calling process (picklable: send it to a Ray actor).

    model_class / model_config: the policy's NNX class and its config (`model_class(config,
    rngs=...)`). params: the policy's `nnx.State`, host numpy leaves (what crosses a process
    boundary) or device arrays (copied, so the caller may donate its own). seed / pad_id /
    initial_version / banned_token_ids / interrupt_tokens / share_prompts / prefix_cache_tokens /
    shared_prefix_attention: as `JaxSamplerEngine`'s (the last as its `Sampler`'s). tokenizer_dir:
    where the image processor comes from (None: the shipped tiny one).
    """

    model_class: type
    model_config: Any
    params: Any
    seed: int = 0
    pad_id: int = 0
    tokenizer_dir: str | None = None
    initial_version: int = 0
    banned_token_ids: tuple[int, ...] = ()
    interrupt_tokens: int = 0
    share_prompts: bool = False
    prefix_cache_tokens: int = 0
    shared_prefix_attention: bool = False

    def __call__(self) -> JaxSamplerEngine:
        # The structure alone (no random init): every value comes from params.
        model = nnx.eval_shape(lambda: self.model_class(self.model_config, rngs=nnx.Rngs(0)))
        copies = jax.tree.map(lambda x: jnp.array(x, copy=True), self.params)
        nnx.update(model, copies)
        missing = sum(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(nnx.state(model)))
        if missing:
            raise ValueError(f"params lack {missing} of the {self.model_class.__name__} parameters")
        _, image_processor = load_processor(self.tokenizer_dir)
        return JaxSamplerEngine(
            model,
            seed=self.seed,
            image_processor=image_processor,
            initial_version=self.initial_version,
            pad_id=self.pad_id,
            banned_token_ids=self.banned_token_ids,
            interrupt_tokens=self.interrupt_tokens,
            share_prompts=self.share_prompts,
            prefix_cache_tokens=self.prefix_cache_tokens,
            shared_prefix_attention=self.shared_prefix_attention,
        )
