"""One trainer step with a Qwen3.5 policy loaded from a Hugging Face directory (model.name
"qwen3_5", model.init_from) on real MiniWoB++ capsules with screenshots: the policy samples with
its hybrid cache and images, and the learner updates it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flax import nnx

from cua_jax.context.tokenizer import load_tokenizer
from cua_jax.models.hf_policy import export_policy, load_policy
from cua_jax.models.qwen3_5 import Qwen3_5ForConditionalGeneration, tiny_qwen3_5_config
from experiments.configs import tiny
from tests.support.trainer import start_trainer

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_one_trainer_step_from_a_qwen3_5_directory_with_screenshots(tmp_path):
    policy = Qwen3_5ForConditionalGeneration(tiny_qwen3_5_config(), rngs=nnx.Rngs(0))
    directory = tmp_path / "qwen3_5"
    found = export_policy(policy, directory, tokenizer=load_tokenizer())
    assert (found.kind, found.architecture) == ("qwen3_5", "Qwen3_5ForConditionalGeneration")
    loaded, kind = load_policy(directory)
    assert kind == "qwen3_5" and isinstance(loaded, Qwen3_5ForConditionalGeneration)

    c = tiny.get_config()
    c.workdir = str(tmp_path / "run")
    c.model.name, c.model.init_from, c.model.num_layers = "qwen3_5", str(directory), 0
    c.env.observation = "screenshot"
    c.train.num_steps = 1
    with start_trainer(c) as trainer:
        before = [np.asarray(v) for _, v in nnx.to_flat_state(nnx.state(trainer.learner.model, nnx.Param))]
        metrics = trainer.train_step()
        after = [np.asarray(v) for _, v in nnx.to_flat_state(nnx.state(trainer.learner.model, nnx.Param))]
    assert isinstance(trainer.learner.model, Qwen3_5ForConditionalGeneration)
    assert math.isfinite(metrics["learner/loss"]) and metrics["learner/num_tokens"] > 0
    assert metrics["episodes/trained"] == 4 and metrics["learner/grad_norm"] > 0
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
