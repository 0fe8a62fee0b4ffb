"""The shipped base policy (experiments/bases/miniwob-elements, the embedded default run's
model.init_from): a Hugging Face Qwen3-VL directory of at most 30 MB with its manifest. It loads
with the run's tokenizer, and played greedily on the manifest's held-out pages it succeeds as
often as the manifest says."""

from __future__ import annotations

import json
import os

import pytest

from cua_jax.models.qwen3_vl import load_qwen3_vl
from cua_jax.train.build import load_run_processor
from cua_jax.train.pretrain import MANIFEST_FILE, Pretrainer
from cua_jax.train.settings import TrainSettings, pretrain_settings
from experiments.configs import default
from experiments.configs.base import config_from_dict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = os.path.join(ROOT, default.BASE)


def manifest():
    with open(os.path.join(BASE, MANIFEST_FILE)) as f:
        return json.load(f)


def test_the_base_is_complete_small_and_loads_with_the_runs_tokenizer():
    files = set(os.listdir(BASE))
    assert {"config.json", "model.safetensors", MANIFEST_FILE, "preprocessor_config.json", "tokenizer.json"} <= files
    size = sum(os.path.getsize(os.path.join(BASE, name)) for name in files)
    assert size <= 30 * 2**20, f"{size / 2**20:.1f} MiB"
    m = manifest()
    for field in ("recipe", "commit", "demonstration_seeds", "held_out", "held_out_success", "wall_seconds"):
        assert field in m, field
    # Grounded: the held-out element-id digits score well below the page-blind prior.
    assert m["held_out"]["held_out_click_nll"] < 0.5 * m["held_out"]["click_prior_nll"]
    config = default.get_config()
    settings = TrainSettings.from_config(config)  # checks model.init_from
    assert settings.model.init_from == default.BASE
    tokenizer, _ = load_run_processor(settings.model)
    model, _ = load_qwen3_vl(BASE)
    assert model.config.text.vocab_size >= len(tokenizer)


@pytest.mark.browser
@pytest.mark.slow
def test_the_base_succeeds_on_its_held_out_pages_as_its_manifest_says(tmp_path):
    m = manifest()
    config = config_from_dict(m["recipe"])  # the recipe of its commit, on today's base
    config.workdir = str(tmp_path)
    config.env.tasks = default.get_config().env.tasks  # the tasks the default run trains on
    pretrainer = Pretrainer(TrainSettings.from_config(config), pretrain_settings(config))
    try:
        assert [pretrainer.eval_seeds.start, pretrainer.eval_seeds.stop] == m["demonstration_seeds"]["held_out_success"]
        result = pretrainer.greedy_success(load_qwen3_vl(BASE)[0])
    finally:
        pretrainer.close()
    for task in default.TASKS:
        # Greedy decoding is deterministic; the pages' timing is not quite (10 pages per task).
        assert abs(result["per_task"][task] - m["held_out_success"]["per_task"][task]) <= 0.2, (task, result)
