"""Pretraining a base (the pretrain recipe, a few steps on real capsules): demonstrations saved
once, an interrupted run resumed exactly, the Hugging Face export with its manifest, and a
training run that starts from it with model.init_from."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from cua_jax.models.qwen3_vl import load_qwen3_vl
from cua_jax.train.pretrain import DEMONSTRATIONS_FILE, MANIFEST_FILE, STATE_FILE, Pretrainer
from cua_jax.train.settings import ConfigError, TrainSettings, pretrain_settings
from cua_jax.train.sft import SupervisedRun
from experiments.configs import pretrain
from tests.support.trainer import start_trainer

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def small_config(workdir, steps):
    """The pretrain recipe on two tasks in the elements space, a few steps of a 2-layer policy."""
    c = pretrain.get_config()
    c.workdir = str(workdir)
    c.model.num_layers = 2
    c.env.tasks = (("click-button", 0), ("focus-text", 0))
    c.warm_start.demos_per_task = 2
    c.warm_start.held_out_seeds = 1
    c.warm_start.steps = steps
    c.warm_start.rows = 2
    c.warm_start.warmup_steps = 1
    c.warm_start.concurrency = 2
    c.pretrain.checkpoint_every = 2
    c.pretrain.eval_every = 2
    c.pretrain.eval_seeds = 1
    c.train.progress_bar = False
    return c


def params(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def run(config):
    pretrainer = Pretrainer(TrainSettings.from_config(config), pretrain_settings(config))
    try:
        return pretrainer, pretrainer.run()
    finally:
        pretrainer.close()


def test_pretrain_resumes_exactly_and_exports_a_base_that_a_run_starts_from(tmp_path, monkeypatch):
    # A run killed after its step-4 save (of 6 steps), continued by the same command.
    interrupted = tmp_path / "interrupted"
    train = SupervisedRun.run

    def killed_after_step_4(self, until, on_step=None):
        if until > 4:
            raise KeyboardInterrupt
        return train(self, until, on_step)

    monkeypatch.setattr(SupervisedRun, "run", killed_after_step_4)
    with pytest.raises(KeyboardInterrupt):
        run(small_config(interrupted, steps=6))
    monkeypatch.undo()
    assert os.path.exists(interrupted / STATE_FILE) and os.path.exists(interrupted / DEMONSTRATIONS_FILE)
    assert not os.path.exists(interrupted / "base")
    resumed, manifest = run(small_config(interrupted, steps=6))
    # The uninterrupted run reads the same demonstrations (so both train on the same items).
    straight = tmp_path / "straight"
    straight.mkdir()
    shutil.copy(interrupted / DEMONSTRATIONS_FILE, straight / DEMONSTRATIONS_FILE)
    uninterrupted, _ = run(small_config(straight, steps=6))
    for a, b in zip(params(resumed.policy), params(uninterrupted.policy)):
        np.testing.assert_array_equal(a, b)

    base = interrupted / "base"
    written = json.loads((base / MANIFEST_FILE).read_text())
    assert written == json.loads(json.dumps(manifest))
    assert written["steps"] == 6 and written["tasks"] == ["click-button", "focus-text"]
    assert written["action_space"] == "elements" and written["commit"]
    assert {"held_out_nll", "held_out_click_nll", "click_prior_nll"} <= set(written["held_out"])
    assert [h["step"] for h in written["history"]] == [2, 4, 6]
    assert set(written["held_out_success"]["per_task"]) == {"click-button", "focus-text"}
    assert os.path.exists(interrupted / "pretrain_curve.png")
    loaded, _ = load_qwen3_vl(base)
    for a, b in zip(params(loaded), params(resumed.policy)):
        np.testing.assert_array_equal(a, b)

    # A training run starts from the export; its config errors name model.init_from.
    c = small_config(tmp_path / "train", steps=0)
    c.job, c.model.name, c.model.init_from, c.model.num_layers = "train", "qwen3_vl", str(base), 0
    c.warm_start.steps = 0
    c.eval.enabled = False
    c.train.num_steps = 0
    with start_trainer(c) as trainer:
        for a, b in zip(params(trainer.learner.model), params(loaded)):
            np.testing.assert_array_equal(a, b)
    bad = c.copy_and_resolve_references()
    bad.model.name = "tiny_qwen3_vl"
    with pytest.raises(ConfigError, match=r"config\.model\.init_from: .*random init"):
        TrainSettings.from_config(bad)
    bad.model.name, bad.model.init_from = "qwen3_vl", ""
    with pytest.raises(ConfigError, match=r"config\.model\.init_from: .*set model.init_from"):
        TrainSettings.from_config(bad)
    bad.model.init_from = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"config\.model\.init_from: .* is not a directory"):
        start_trainer(bad)
