"""The built-in JAX sampler behind the rollout-engine interface.

`cua_jax.models.sampler.Sampler` already follows the engine's logprob convention
(renormalised top-k / top-p distribution at the sampling temperature; plain model
distribution for greedy), so this adapter only translates requests, keys and versions.
Images (Qwen3-VL) go through the model directory's image processor and the VL model's
prefill extras.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from cua_jax.models.sampler import Sampler, SamplingParams
from cua_jax.rollout.engine import (
    EngineHealth,
    FinishReason,
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
)


class JaxSamplerEngine(RolloutEngine):
    """Generation with an in-process NNX model.

    model: a `DecoderLM` (Qwen3ForCausalLM, Qwen3VLForConditionalGeneration).
    seed: base of the PRNG stream; calls without `SamplingConfig.seed` fold in a
    call counter, so successive calls draw fresh randomness.
    image_processor: needed only for requests with images (VL models).
    """

    def __init__(
        self,
        model: nnx.Module,
        *,
        seed: int = 0,
        image_processor: Any = None,
        initial_version: int = 0,
        **sampler_kwargs: Any,
    ):
        self._sampler = Sampler(model, **sampler_kwargs)
        self._base_key = jax.random.key(seed)
        self._calls = 0
        self._image_processor = image_processor
        self._version = initial_version
        self._lock = threading.Lock()

    @property
    def model(self) -> nnx.Module:
        return self._sampler.model

    def _prefill_extras(self, requests: Sequence[GenerationRequest]):
        images = [image for r in requests for image in r.images]
        if not images:
            return None
        if not hasattr(self.model, "encode_images"):
            raise ValueError(f"{type(self.model).__name__} is text-only; the requests carry images")
        if self._image_processor is None:
            raise ValueError("requests carry images but the engine has no image_processor")
        from cua_jax.models.qwen3_vl import image_prefill_extras

        processed = self._image_processor(images=images, return_tensors="np")
        grid = [tuple(int(x) for x in row) for row in np.asarray(processed["image_grid_thw"])]
        return image_prefill_extras(self.model.config, np.asarray(processed["pixel_values"]), grid)

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig
    ) -> list[Generation]:
        if not requests:
            return []
        params = SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            max_new_tokens=sampling.max_new_tokens,
            stop_token_ids=tuple(int(t) for t in sampling.stop_token_ids),
        )
        with self._lock:
            if sampling.seed is not None:
                key = jax.random.key(sampling.seed)
            else:
                key = jax.random.fold_in(self._base_key, self._calls)
                self._calls += 1
            version = self._version
            out = self._sampler.generate(
                [r.prompt_ids for r in requests], params, key, prefill_extras=self._prefill_extras(requests)
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

    def update_weights(self, params: Any, version: int) -> None:
        """params: an NNX module of the same architecture, or its `nnx.State`."""
        state = params if isinstance(params, nnx.State) else nnx.state(params)
        with self._lock:
            nnx.update(self.model, state)
            self._version = version

    def health(self) -> EngineHealth:
        return EngineHealth(healthy=True, policy_version=self._version)
