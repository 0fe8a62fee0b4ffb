"""experiments/export.py on a real run: a tiny Qwen3-VL trained two steps on MiniWoB++ capsules,
checkpointed after each; the export of either step loads in transformers with the logits the
policy had at that step, and carries the run's own tokenizer, chat template and image processor."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from cua_jax.context.tokenizer import (
    QWEN_VL_CHAT_TEMPLATE,
    SHIPPED_TOKENIZER_DIR,
    build_image_processor,
    load_processor,
    pixel_bounds,
)
from cua_jax.models.hf_policy import load_policy
from cua_jax.models.qwen3_vl import rope_index
from cua_jax.models.vision import ImageGrid
from experiments import export
from experiments.configs import tiny
from tests.support.trainer import start_trainer

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The run's chat template renders as the shipped one (the trainer's renderer relies on its layout)
# but is a different string, so an export that fell back to the shipped files would show.
RUN_TEMPLATE = QWEN_VL_CHAT_TEMPLATE + "{#- the run's own template -#}"
RUN_MAX_PIXELS = 128 * 32 * 32


def run_export(*args):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "experiments.export", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def probe_inputs(tokenizer, image_processor):
    """One chat-rendered prompt with a screenshot: (ids [1, L], pixel values, grid)."""
    from PIL import Image

    pixels = np.random.RandomState(0).randint(0, 255, size=(210, 160, 3)).astype(np.uint8)
    out = image_processor(images=[Image.fromarray(pixels)], return_tensors="np")
    grid = tuple(map(tuple, out["image_grid_thw"].tolist()))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click the button."}]}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = list(ids["input_ids"]) if isinstance(ids, dict) else list(ids)
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merged = grid[0][0] * grid[0][1] * grid[0][2] // image_processor.merge_size**2
    expanded = [t for tok in ids for t in ([tok] * merged if tok == image_pad else [tok])]
    return np.asarray([expanded], np.int64), out["pixel_values"].astype(np.float32), grid


def our_logits(model, inputs):
    ids, pixel_values, grid = inputs
    config = model.config
    positions, _ = rope_index(
        ids, grid, image_token_id=config.image_token_id, spatial_merge_size=config.vision.spatial_merge_size
    )
    logits, _ = model(
        jnp.asarray(ids, jnp.int32),
        positions=jnp.asarray(positions),
        pixel_values=jnp.asarray(pixel_values),
        image_grid_thw=ImageGrid.of(grid),
    )
    return np.asarray(logits)


def transformers_logits(directory, inputs):
    import torch
    import transformers

    ids, pixel_values, grid = inputs
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(directory).eval()
    image_token_id = model.config.image_token_id
    with torch.no_grad():
        return model(
            input_ids=torch.as_tensor(ids),
            attention_mask=torch.ones_like(torch.as_tensor(ids)),
            pixel_values=torch.as_tensor(pixel_values),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor((ids == image_token_id).astype(np.int64)),
        ).logits.numpy()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """(workdir, the run's tokenizer directory, {step: our logits on the probe at that step})."""

    tokenizer_dir = tmp_path_factory.mktemp("run_tokenizer")
    for name in os.listdir(SHIPPED_TOKENIZER_DIR):
        shutil.copyfile(SHIPPED_TOKENIZER_DIR / name, tokenizer_dir / name)
    (tokenizer_dir / "chat_template.jinja").write_text(RUN_TEMPLATE, encoding="utf-8")
    build_image_processor(max_pixels=RUN_MAX_PIXELS).save_pretrained(tokenizer_dir)

    config = tiny.get_config()
    config.workdir = str(tmp_path_factory.mktemp("run"))
    config.model.tokenizer_dir = str(tokenizer_dir)
    logits = {}
    with start_trainer(config) as trainer:
        inputs = probe_inputs(trainer.tokenizer, trainer.image_processor)
        for _ in range(2):
            trainer.train_step()
            trainer.save()
            logits[trainer.step] = our_logits(trainer.learner.model, inputs)
    assert not np.allclose(logits[1], logits[2], atol=1e-3)  # the steps' policies differ
    return config.workdir, tokenizer_dir, logits, inputs


def test_the_command_line_exports_the_latest_step(trained_run, tmp_path):
    workdir, tokenizer_dir, logits, inputs = trained_run
    out = tmp_path / "policy"
    result = run_export(f"--workdir={workdir}", f"--out={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"exported step 2 of {workdir}" in result.stdout
    np.testing.assert_allclose(transformers_logits(out, inputs), logits[2], atol=1e-4, rtol=0)
    tokenizer, image_processor = load_processor(out)
    run_tokenizer, run_processor = load_processor(tokenizer_dir)
    assert tokenizer.chat_template == RUN_TEMPLATE and tokenizer.get_vocab() == run_tokenizer.get_vocab()
    assert (
        pixel_bounds(image_processor) == pixel_bounds(run_processor)
        and pixel_bounds(image_processor)[1] == RUN_MAX_PIXELS
    )
    model, kind = load_policy(out)
    assert kind == "qwen3_vl"
    np.testing.assert_allclose(our_logits(model, inputs), logits[2], atol=1e-5, rtol=0)


def test_an_earlier_step_exports_that_steps_policy(trained_run, tmp_path):
    workdir, _, logits, inputs = trained_run
    step, policy = export.export_run(workdir, tmp_path / "step1", step=1)
    assert step == 1 and policy.kind == "qwen3_vl"
    np.testing.assert_allclose(transformers_logits(tmp_path / "step1", inputs), logits[1], atol=1e-4, rtol=0)


def test_a_missing_step_lists_the_steps_present(trained_run, tmp_path):
    workdir, _, _, _ = trained_run
    result = run_export(f"--workdir={workdir}", f"--out={tmp_path / 'out'}", "--step=7")
    assert result.returncode != 0
    assert f"{workdir}/checkpoints has no checkpoint of step 7; steps present: [1, 2]" in result.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        export.export_run(workdir, tmp_path / "taken")
    with pytest.raises(ValueError, match="is not a training run's workdir"):
        export.export_run(tmp_path, tmp_path / "out")
