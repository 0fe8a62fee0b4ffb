"""The one interface every rollout engine implements: token ids in, token ids and logprobs out.

An engine (vLLM, the built-in JAX sampler, or a router over several of either) takes a
batch of prompts given as token ids (plus the images their placeholder tokens stand for)
and returns, per prompt, the sampled token ids, the logprob of each sampled token, why
generation stopped, and the policy version whose weights produced it. Nothing is ever
detokenized and re-tokenized on the way (token-in, token-out).

Logprob convention (shared by every engine): the logprob of a sampled token is taken
under the distribution the token was actually drawn from, i.e. log softmax of
logits / temperature after top-k and top-p filtering, renormalised over the tokens that
survive the filters. Greedy decoding (temperature 0) reports log softmax of the raw
logits (temperature 1, no filtering): the model's own distribution.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from cua_jax.envs.faults import FaultError, FaultKind


class FinishReason(str, enum.Enum):
    """Why a generation ended: a stop token was sampled, or the token budget ran out."""

    STOP = "stop"
    LENGTH = "length"


def check_rope_scaling(factor: float) -> None:
    """A rope_scaling value is 0 (the model's own rope) or a YaRN factor above 1."""
    if factor != 0 and not factor > 1:
        raise ValueError(f"rope_scaling must be 0 (off) or a YaRN factor > 1, got {factor}")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to sample one batch.

    temperature 0 means greedy. top_k <= 0 and top_p == 1 switch those filters off.
    stop_token_ids end a generation when sampled (the stop token is included in the
    output). seed makes a call reproducible (each engine derives its per-request
    streams from it: vLLM seeds request i with seed + i, the JAX sampler splits one key).
    rope_scaling: > 1 runs the policy with its rope extended by YaRN at that factor
    (`cua_jax.models.qwen3.rope_scaled`: a longer context, same weights); 0 its own rope.
    Only the JAX sampler supports it (evaluation at a longer context, config.eval.rope_scaling).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    rope_scaling: float = 0.0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(int(t) < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")
        check_rope_scaling(self.rope_scaling)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass
class GenerationRequest:
    """One prompt: its token ids and the images its image placeholders stand for.

    prompt_ids: int32 [P], already rendered by the chat template (image-pad tokens
    included for multimodal models). images: uint8 [H, W, 3] screenshots, in the order
    their placeholders appear in prompt_ids. seed: this request's own sampling stream
    (in [0, 2**31)), independent of the batch it lands in and of `SamplingConfig.seed`;
    None: the engine's stream for the call.
    """

    prompt_ids: np.ndarray
    images: list[np.ndarray] = dataclasses.field(default_factory=list)
    seed: int | None = None

    def __post_init__(self):
        ids = np.asarray(self.prompt_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"prompt_ids must be a non-empty 1-D array, got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"prompt_ids must be integers, got dtype {ids.dtype}")
        if (ids < 0).any():
            raise ValueError("prompt_ids must be non-negative token ids")
        self.prompt_ids = ids.astype(np.int32)
        if self.seed is not None and not 0 <= int(self.seed) < 2**31:
            raise ValueError(f"seed must be in [0, 2**31), got {self.seed}")
        for i, image in enumerate(self.images):
            if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8:
                raise ValueError(f"image {i} must be uint8 [H, W, 3], got {image.dtype} {image.shape}")


@dataclasses.dataclass
class Generation:
    """What the engine produced for one request.

    token_ids: int32 [R] sampled ids (a sampled stop token included).
    logprobs: float32 [R] logprob of each sampled token (convention in the module doc).
    policy_version: the version passed to the update_weights that loaded the weights
    which produced the tokens here (the oldest, when a weight update landed mid-generation).
    token_versions: int32 [R], each token's policy version when a weight update interrupted
    the generation (a partial rollout: it went on under the new weights); None: every token
    is policy_version's.
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: FinishReason
    policy_version: int
    token_versions: np.ndarray | None = None

    def __post_init__(self):
        if self.token_ids.shape != self.logprobs.shape or self.token_ids.ndim != 1:
            raise ValueError(
                f"token_ids {self.token_ids.shape} and logprobs {self.logprobs.shape} must be equal-length 1-D arrays"
            )
        if self.token_versions is not None and np.shape(self.token_versions) != self.token_ids.shape:
            raise ValueError(
                f"token_versions {np.shape(self.token_versions)} must match token_ids {self.token_ids.shape}"
            )

    def version_segments(self) -> list[tuple[int, int]]:
        """[(first token index, policy version)] of each run of tokens one version produced."""
        if self.token_versions is None or not len(self.token_versions):
            return [(0, int(self.policy_version))]
        versions = np.asarray(self.token_versions)
        starts = [0] + [int(i) for i in np.flatnonzero(versions[1:] != versions[:-1]) + 1]
        return [(start, int(versions[start])) for start in starts]


@dataclasses.dataclass(frozen=True)
class EngineHealth:
    """A snapshot of an engine: whether it answers, and which weights it holds."""

    healthy: bool
    policy_version: int
    detail: str = ""


class EngineFault(FaultError, RuntimeError):
    """The engine (a process or actor serving the policy) died while serving a request: an
    infrastructure fault (`fault`: ENGINE_FAILED), which quarantines the episodes waiting on it."""

    fault_kind = FaultKind.ENGINE_FAILED


class RolloutEngine(abc.ABC):
    """Token-in, token-out generation with swappable weights.

    Implementations are not required to be thread-safe; `Router` (workers.py) serialises
    calls per engine and keeps policy versions consistent across several.
    """

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        """One Generation per request, in request order."""

    @abc.abstractmethod
    def update_weights(self, params: Any, version: int) -> None:
        """Loads new weights; generations started after this return carry `version`.

        `params` is the policy's parameter tree (the JAX model's state); each engine
        converts it to what it serves.
        """

    @abc.abstractmethod
    def health(self) -> EngineHealth:
        """Cheap liveness check; never raises for a dead engine, reports it instead."""

    def stats(self) -> dict[str, float]:
        """Counters of the engine's work so far, where it keeps any (for benchmarks). Shared keys:
        prompt_tokens (prompt tokens asked for) and cached_tokens (those served from a prefix
        cache, not computed again), so hit rates compare across engines. Default: none."""
        return {}

    def close(self) -> None:
        """Releases processes and memory; the engine is unusable afterwards."""


class ScriptedEngine(RolloutEngine):
    """An engine whose replies come from a script or a rule, not from weights (the oracles, the
    random policy): always healthy, and asked to load weights it is an error. Subclasses
    implement `generate`; `name` says what they are in that error."""

    name = "a scripted engine"

    def update_weights(self, params: Any, version: int) -> None:
        raise NotImplementedError(f"{self.name} has no weights")

    def health(self) -> EngineHealth:
        return EngineHealth(True, 0)


def check_prompt_lengths(requests: Sequence[GenerationRequest], sampling: SamplingConfig, max_model_len: int) -> None:
    """Raises ValueError naming the first request whose prompt + budget exceeds the context."""
    for i, request in enumerate(requests):
        total = request.prompt_ids.shape[0] + sampling.max_new_tokens
        if total > max_model_len:
            raise ValueError(
                f"request {i}: prompt of {request.prompt_ids.shape[0]} tokens + "
                f"max_new_tokens {sampling.max_new_tokens} exceeds the engine's "
                f"max_model_len {max_model_len}"
            )
