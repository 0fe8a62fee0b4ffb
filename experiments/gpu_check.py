"""Accelerator smoke check: model parity, sharding and a bfloat16 learner step, in minutes.

Runs on whatever JAX backend is installed (CUDA on a GPU machine, the host CPU otherwise)
and needs no package registry: only jax, flax, optax, numpy, ml_dtypes and tokenizers for
the model code, plus torch and transformers for the parity checks. `launch/gpu_check.sh` is
the entry point (it installs wheels from launch/wheels/ for packages that are missing).

Checks (each timed, each independent: one failing does not stop the others):
  parity_qwen3     our Qwen3 logits vs transformers' Qwen3ForCausalLM (float32, torch on CPU)
  parity_qwen3_vl  our Qwen3-VL logits vs transformers' Qwen3VLForConditionalGeneration, one
                   image row and one left-padded text row
  sharding         logits, loss and gradients of a tiny Qwen3 on meshes over all visible
                   devices equal one device's; sharded parameters take 1/n bytes per device
  learner_bf16     one learner step of a tiny Qwen3-VL (with an image) with bfloat16 parameters
                   and compute and rematerialised layers: finite loss, float32 optimizer state,
                   bfloat16 parameters, update direction vs the float32 step (cosine)
  shared_prefix    the learner on a GRPO group with its prompt run once (learner.share_prefix) vs
                   every item run whole: equal loss, gradient cosine, tokens/s of each; at full
                   size a Qwen3-VL-2B-shaped model (random bfloat16 weights, 1,500-token prompt
                   with a 640 x 448 screenshot, 8 members)

Float32 matmuls run at "highest" precision in the parity and sharding checks (GPUs would
otherwise use TF32, whose 10-bit mantissa is not what those tolerances measure).

Usage: python -m experiments.gpu_check [--small] [--checks a,b] [--json PATH]
Exit status 0 when every check passed, 1 when one failed, 2 when a package was missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

# The CPU backend gets 8 devices so the sharding check builds real meshes there too; the flag
# must be set before JAX starts and does not change the devices of a GPU backend.
if os.environ.get("JAX_PLATFORMS", "") == "cpu" and "xla_force_host_platform_device_count" not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

MODEL_PACKAGES = ("numpy", "jax", "flax", "optax", "ml_dtypes", "tokenizers")
PARITY_PACKAGES = ("torch", "transformers")
CHECKS = ("parity_qwen3", "parity_qwen3_vl", "sharding", "learner_bf16", "shared_prefix")
PARITY_TOL = 1e-3  # float32 logits of spread ~1; a wrong layer is off by O(1)
SHARDING_TOL = dict(atol=2e-5, rtol=2e-5)  # float32 reductions in another order
MIN_COSINE = 0.99


@dataclasses.dataclass
class Result:
    check: str
    status: str  # PASS | FAIL | MISSING
    seconds: float
    detail: str


class CheckFailed(AssertionError):
    pass


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


def missing_packages(names) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


def _spread_weights(model, norm_suffixes: tuple[str, ...]) -> None:
    """Spread-out random weights (norms around 1), so logits vary enough for parity to mean something."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(norm_suffixes):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))


# ---------------------------------------------------------------------------
# Checks: each returns a detail string or raises CheckFailed
# ---------------------------------------------------------------------------


def check_parity_qwen3(small: bool) -> str:
    import jax
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from cua_jax.models.qwen3 import load_qwen3

    torch.manual_seed(0)
    hf_config = transformers.Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1 if small else 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    hf = transformers.Qwen3ForCausalLM(hf_config).eval()
    _spread_weights(hf, ("norm.weight",))
    ids = np.random.RandomState(0).randint(3, 512, size=(2, 12 if small else 64))
    with torch.no_grad():
        expected = hf(torch.as_tensor(ids)).logits.numpy()
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        model, _ = load_qwen3(directory)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(nnx.jit(lambda m, i: m(i)[0])(model, jax.numpy.asarray(ids, jax.numpy.int32)))
    error = float(np.abs(got - expected).max())
    _require(expected.std() > 0.5, f"reference logits barely vary (std {expected.std():.3f})")
    _require(error < PARITY_TOL, f"max |ours - transformers| = {error:.2e} >= {PARITY_TOL}")
    return f"max |diff| {error:.1e} over logits of std {expected.std():.2f} (transformers {transformers.__version__})"


def check_parity_qwen3_vl(small: bool) -> str:
    import dataclasses as dc

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from cua_jax.models.qwen3_vl import load_qwen3_vl, rope_index, tiny_qwen3_vl_config
    from cua_jax.models.vision import ImageGrid

    config = tiny_qwen3_vl_config()
    if small:
        config = dc.replace(
            config,
            text=dc.replace(config.text, num_hidden_layers=2),
            vision=dc.replace(config.vision, depth=2, deepstack_visual_indexes=(0, 1)),
        )
    torch.manual_seed(0)
    hf = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(**config.to_hf_dict())).eval()
    _spread_weights(hf, ("norm.weight", "norm1.weight", "norm2.weight"))

    # Row 0: text, one image (a MiniWoB-sized 14 x 10 patch grid, or 4 x 4), text. Row 1: text only, left-padded.
    grid = ((1, 4, 4),) if small else ((1, 14, 10),)
    merge = config.vision.spatial_merge_size
    image_tokens = grid[0][1] * grid[0][2] // merge**2
    rng = np.random.RandomState(0)

    def text(n):  # ordinary token ids, below the tokenizer's special ones
        return list(rng.randint(10, 3000, n))

    row0 = text(5) + [config.vision_start_token_id] + [config.image_token_id] * image_tokens
    row0 += [config.vision_end_token_id] + text(8 if small else 40)
    row1 = text(len(row0) - 6)
    length = len(row0)
    ids = np.full((2, length), config.text.pad_token_id, np.int64)
    mask = np.zeros_like(ids)
    ids[0], mask[0] = row0, 1
    ids[1, length - len(row1) :], mask[1, length - len(row1) :] = row1, 1
    patches = sum(t * h * w for t, h, w in grid)
    pixels = rng.normal(size=(patches, config.vision.patch_dim)).astype(np.float32)

    with torch.no_grad():
        expected = hf(
            input_ids=torch.as_tensor(ids),
            attention_mask=torch.as_tensor(mask),
            pixel_values=torch.as_tensor(pixels),
            image_grid_thw=torch.as_tensor(grid),
            mm_token_type_ids=torch.as_tensor((ids == config.image_token_id).astype(np.int64)),
        ).logits.numpy()
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        model, _ = load_qwen3_vl(directory)
    positions, _ = rope_index(
        ids, grid, image_token_id=config.image_token_id, spatial_merge_size=merge, attention_mask=mask
    )

    def forward(model, ids, segment_ids, positions, pixels):
        return model(
            ids, positions=positions, segment_ids=segment_ids, pixel_values=pixels, image_grid_thw=ImageGrid(grid)
        )[0]

    with jax.default_matmul_precision("highest"):
        got = np.asarray(
            nnx.jit(forward)(
                model,
                jnp.asarray(ids, jnp.int32),
                jnp.asarray(mask, jnp.int32),
                jnp.asarray(positions),
                jnp.asarray(pixels),
            )
        )
    real = mask.astype(bool)
    error = float(np.abs(got[real] - expected[real]).max())
    _require(expected[real].std() > 0.5, f"reference logits barely vary (std {expected[real].std():.3f})")
    _require(error < PARITY_TOL, f"max |ours - transformers| = {error:.2e} >= {PARITY_TOL}")
    return f"max |diff| {error:.1e}; {image_tokens} image tokens of grid {grid[0]}, {length} tokens per row"


def _mesh_configs(n: int, small: bool):
    """All-FSDP, FSDP x 2-way tensor and (unless small) all-tensor meshes over n devices."""
    from cua_jax.models.sharding import MeshConfig

    configs = [MeshConfig(data=1, fsdp=n, tensor=1)]
    if n % 2 == 0 and n >= 4:
        configs.append(MeshConfig(data=1, fsdp=n // 2, tensor=2))
    if n > 1 and not small:
        configs.append(MeshConfig(data=1, fsdp=1, tensor=n if n <= 8 else 2))
    return configs


def check_sharding(small: bool) -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from cua_jax.models.qwen3 import Qwen3ForCausalLM, tiny_qwen3_config
    from cua_jax.models.sharding import bytes_per_device, make_mesh, shard_model, use_mesh

    devices = jax.devices()
    n = len(devices)
    config = tiny_qwen3_config(num_hidden_layers=1 if small else 2)
    rows = n * max(1, 8 // n)  # divisible by every data x fsdp size below
    ids = jnp.asarray(np.random.RandomState(0).randint(3, config.vocab_size, size=(rows, 16 if small else 128)))

    def loss_fn(model, ids):
        logits, _ = model(ids[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], axis=-1))

    @nnx.jit
    def logits_and_grads(model, ids):
        loss, grads = nnx.value_and_grad(loss_fn)(model, ids)
        return model(ids)[0], loss, nnx.to_pure_dict(grads)

    with jax.default_matmul_precision("highest"):
        reference = jax.device_get(logits_and_grads(Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), ids))
        checked = []
        for mesh_config in _mesh_configs(n, small):
            mesh = make_mesh(mesh_config, devices=devices)
            model = shard_model(Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), mesh)
            with use_mesh(mesh):
                got = jax.device_get(logits_and_grads(model, ids))
            shape = f"fsdp{mesh_config.fsdp}xtensor{mesh_config.tensor}"
            for name, a, b in (("logits", got[0], reference[0]), ("loss", got[1], reference[1])):
                _require(np.allclose(a, b, **SHARDING_TOL), f"{shape}: {name} differ by {np.abs(a - b).max():.2e}")
            for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got[2]), jax.tree.leaves(reference[2])):
                _require(
                    np.allclose(a, b, **SHARDING_TOL),
                    f"{shape}: gradient {jax.tree_util.keystr(path)} differs by {np.abs(a - b).max():.2e}",
                )
            kernel = model.model.layers[0].mlp.gate_proj.kernel[...]
            placed = len(kernel.sharding.device_set)
            _require(placed == n, f"{shape}: a kernel sits on {placed} of {n} devices")
            if n in (2, 4, 8):  # every sharded dimension of the tiny model divides by these
                sharded = jax.tree.map(lambda a: a if not a.sharding.is_fully_replicated else None, nnx.state(model))
                total = sum(a.nbytes for a in jax.tree.leaves(sharded))
                per_device = bytes_per_device(sharded)
                _require(
                    set(per_device.values()) == {total // n},
                    f"{shape}: sharded parameters take {sorted(set(per_device.values()))} bytes per device, "
                    f"expected {total // n}",
                )
            checked.append(shape)
    return f"{n} {devices[0].platform} device(s): {', '.join(checked)} equal one device"


def _vl_training_batch(config, rows: int, image_grid: tuple[int, int, int], text_tokens: int):
    """A micro-batch of `rows` items, each with one image and a trained reply, zero-sum advantages."""
    import numpy as np

    from cua_jax.train.batching import BatchingConfig, MultimodalPositions, collate
    from cua_jax.types import ImageSpan, TrainingItem

    rng = np.random.default_rng(0)
    t, h, w = image_grid
    image_tokens = t * h * w // config.vision.spatial_merge_size**2
    items, patches = [], {}
    for k in range(rows):
        ids = [5, 6, config.vision_start_token_id] + [config.image_token_id] * image_tokens
        ids += [config.vision_end_token_id] + list(rng.integers(10, 3000, text_tokens))
        ids = np.asarray(ids, np.int32)
        mask = np.zeros(len(ids), np.int32)
        mask[-text_tokens // 2 :] = 1
        logp = np.where(mask > 0, rng.uniform(-9.0, -7.0, len(ids)), 0).astype(np.float32)
        items.append(
            TrainingItem(ids, mask, logp, [ImageSpan(3, 3 + image_tokens, 0, 0, image_grid)], f"ep{k}", 0, (0,))
        )
        patches[(f"ep{k}", 0, 0)] = rng.normal(size=(t * h * w, config.vision.patch_dim)).astype(np.float32)
    advantages = np.linspace(-1.0, 1.0, rows).astype(np.float32)
    return collate(
        items,
        advantages,
        BatchingConfig(rows=rows, length_multiple=16),
        pixel_patches=patches,
        multimodal=MultimodalPositions.of(config),
    )


def check_learner_bf16(small: bool) -> str:
    import dataclasses as dc

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
    from cua_jax.rl.losses import PolicyLossConfig
    from cua_jax.train.learner import Learner, LearnerConfig, MasterWeightsState, OptimizerConfig

    config = tiny_qwen3_vl_config()
    if small:
        config = dc.replace(
            config,
            text=dc.replace(config.text, num_hidden_layers=1),
            vision=dc.replace(config.vision, depth=1, deepstack_visual_indexes=(0,)),
        )
    low = dc.replace(config, text=dc.replace(config.text, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, remat=True))
    batch = _vl_training_batch(
        config, rows=2 if small else 4, image_grid=(1, 4, 4) if small else (1, 14, 10), text_tokens=12 if small else 200
    )
    reference = Qwen3VLForConditionalGeneration(config, rngs=nnx.Rngs(0))
    rounded = jax.tree.map(lambda a: a.astype(jnp.bfloat16), nnx.state(reference, nnx.Param))
    nnx.update(reference, jax.tree.map(lambda a: a.astype(jnp.float32), rounded))
    model = Qwen3VLForConditionalGeneration(low, rngs=nnx.Rngs(0))
    nnx.update(model, rounded)
    # A large Adam eps keeps the step a smooth function of the gradient (eps 1e-8 is a sign step).
    learner_config = LearnerConfig(
        optimizer=OptimizerConfig(learning_rate=1e-2, eps=1e-3), loss=PolicyLossConfig(kl_coef=0.0)
    )
    steps, losses, seconds = {}, {}, {}
    for name, policy in (("float32", reference), ("bfloat16", model)):
        learner = Learner(policy, learner_config)
        start = [np.asarray(a, np.float32) for a in jax.tree.leaves(learner.params)]
        metrics = learner.update([batch])
        losses[name] = metrics["loss"]
        state = learner.opt_state
        after = state.master if isinstance(state, MasterWeightsState) else learner.params
        steps[name] = np.concatenate(
            [(np.asarray(a, np.float32) - s).ravel() for a, s in zip(jax.tree.leaves(after), start)]
        )
        if name == "bfloat16":
            _require(
                np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0,
                f"loss {metrics['loss']}, grad_norm {metrics['grad_norm']}",
            )
            _require(isinstance(state, MasterWeightsState), "bfloat16 parameters but no float32 master weights")
            dtypes = {str(a.dtype) for a in jax.tree.leaves(learner.params)}
            _require(dtypes == {"bfloat16"}, f"parameters are {sorted(dtypes)} after the step")
            floats = {str(a.dtype) for a in jax.tree.leaves(state) if jnp.issubdtype(a.dtype, jnp.floating)}
            _require(floats == {"float32"}, f"optimizer state holds {sorted(floats)}")
            begin = time.perf_counter()
            learner.update([batch])  # compiled: the step's own time
            seconds[name] = time.perf_counter() - begin
    a, b = steps["float32"], steps["bfloat16"]
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    _require(cosine > MIN_COSINE, f"update direction cosine vs float32 {cosine:.4f} <= {MIN_COSINE}")
    return (
        f"loss {losses['bfloat16']:.4f} (float32 {losses['float32']:.4f}), update cosine {cosine:.5f}, "
        f"compiled step {seconds['bfloat16'] * 1e3:.0f} ms, {batch.ids.shape[0]}x{batch.ids.shape[1]} tokens"
    )


def qwen3_vl_2b_config(**text_overrides):
    """Qwen3-VL-2B-Instruct's shapes (28 x 2048 text layers, a 24-block vision tower with DeepStack
    from blocks 5, 11 and 17), for random weights."""
    from cua_jax.models.configs import RopeConfig
    from cua_jax.models.qwen3 import Qwen3Config
    from cua_jax.models.qwen3_vl import Qwen3VLConfig
    from cua_jax.models.vision import VisionConfig

    text = Qwen3Config(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope=RopeConfig(rope_theta=5_000_000.0),
        tie_word_embeddings=True,
        max_position_embeddings=262144,
        bos_token_id=None,
        eos_token_id=151645,
        pad_token_id=151643,
        **text_overrides,
    )
    vision = VisionConfig(
        depth=24,
        hidden_size=1024,
        intermediate_size=4096,
        num_heads=16,
        out_hidden_size=2048,
        num_position_embeddings=2304,
        deepstack_visual_indexes=(5, 11, 17),
    )
    return Qwen3VLConfig(text=text, vision=vision, mrope_section=(24, 20, 20))


def _group_items(config, members: int, image_grid: tuple[int, int, int], prompt_tokens: int, reply_tokens: int):
    """One GRPO group: `members` items sharing a prompt (text and one screenshot), each with its
    own reply, half of them with a second screenshot and a second reply; and their patches."""
    import numpy as np

    from cua_jax.types import ImageSpan, TrainingItem

    rng = np.random.default_rng(0)
    t, h, w = image_grid
    image_tokens = t * h * w // config.vision.spatial_merge_size**2
    run = [config.vision_start_token_id] + [config.image_token_id] * image_tokens + [config.vision_end_token_id]
    prompt = [5, 6] + run + list(rng.integers(10, 3000, prompt_tokens))
    screenshot = rng.normal(size=(t * h * w, config.vision.patch_dim)).astype(np.float32)
    items, patches = [], {}
    for k in range(members):
        reply = list(rng.integers(10, 3000, reply_tokens))
        ids, mask = prompt + reply, [0] * len(prompt) + [1] * len(reply)
        spans = [ImageSpan(3, 3 + image_tokens, 0, 0, image_grid)]
        patches[(f"ep{k}", 0, 0)] = screenshot
        if k % 2:
            start = len(ids) + 3
            ids += [7, 8] + run + list(rng.integers(10, 3000, reply_tokens))
            mask += [0] * (2 + len(run)) + [1] * reply_tokens
            spans.append(ImageSpan(start, start + image_tokens, 1, 0, image_grid))
            patches[(f"ep{k}", 1, 0)] = rng.normal(size=screenshot.shape).astype(np.float32)
        ids = np.asarray(ids, np.int32)
        mask = np.asarray(mask, np.int32)
        logp = np.where(mask > 0, rng.uniform(-9.0, -7.0, len(ids)), 0).astype(np.float32)
        items.append(TrainingItem(ids, mask, logp, spans, f"ep{k}", 0, (0, 1)))
    return items, patches


def check_shared_prefix(small: bool) -> str:
    """The learner with a group's prompt run once (learner.share_prefix) against every item run
    whole, on a GRPO group: equal loss, the same update direction, and tokens/s of each."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
    from cua_jax.rl.losses import PolicyLossConfig
    from cua_jax.train.batching import BatchingConfig, MultimodalPositions, batch_tokens, make_minibatches
    from cua_jax.train.learner import Learner, LearnerConfig

    if small:
        config, members, grid, prompt, reply = tiny_qwen3_vl_config(), 4, (1, 4, 4), 60, 8
    else:  # a screenshot of 640 x 448 and a 1,500-token prompt, as a desktop turn has
        config = qwen3_vl_2b_config(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, remat=True)
        members, grid, prompt, reply = 8, (1, 28, 40), 1500, 100
    items, patches = _group_items(config, members, grid, prompt, reply)
    advantages = np.linspace(-1.0, 1.0, members).astype(np.float32)
    learner_config = LearnerConfig(loss=PolicyLossConfig(kl_coef=1e-3), freeze_vision=True)
    results = {}
    for share in (False, True):
        # The same random weights each time, built anew: the update donates the learner's
        # parameters, which may be the model's own buffers.
        learner = Learner(Qwen3VLForConditionalGeneration(config, rngs=nnx.Rngs(0)), learner_config)
        batching = BatchingConfig(rows=members, length_multiple=128, share_prefix=share, suffix_length_multiple=64)
        [micro] = make_minibatches(
            items, advantages, batching, 1, pixel_patches=patches, multimodal=MultimodalPositions.of(config)
        )
        grads, metrics = learner.gradients(micro)  # compiles, and the direction to compare
        start = time.perf_counter()
        learner.update(micro)  # prepare (reference) + gradient + AdamW, compiled
        seconds = time.perf_counter() - start
        tokens = sum(len(item) for item in items)
        flat = np.concatenate([np.asarray(g, np.float32).ravel() for g in jax.tree.leaves(grads)])
        results[share] = (metrics["loss"], flat, tokens / seconds, sum(batch_tokens(mb) for mb in micro))
        del learner
    (loss0, g0, rate0, run0), (loss1, g1, rate1, run1) = results[False], results[True]
    cosine = float(g0 @ g1 / (np.linalg.norm(g0) * np.linalg.norm(g1)))
    tolerance = 1e-5 if small else 2e-2  # float32 / bfloat16
    _require(abs(loss0 - loss1) <= tolerance * max(1.0, abs(loss0)), f"loss {loss1} shared vs {loss0} whole")
    _require(cosine > 1 - tolerance, f"gradient cosine shared vs whole {cosine:.6f}")
    return (
        f"{members} items of {sum(len(i) for i in items) // members} tokens: learner {rate0:.0f} item tokens/s "
        f"whole, {rate1:.0f} shared ({rate1 / rate0:.2f}x; forward tokens {run0} -> {run1}), "
        f"gradient cosine {cosine:.6f}"
    )


CHECK_FUNCTIONS: dict[str, tuple[Callable[[bool], str], tuple[str, ...]]] = {
    "parity_qwen3": (check_parity_qwen3, MODEL_PACKAGES + PARITY_PACKAGES),
    "parity_qwen3_vl": (check_parity_qwen3_vl, MODEL_PACKAGES + PARITY_PACKAGES),
    "sharding": (check_sharding, MODEL_PACKAGES),
    "learner_bf16": (check_learner_bf16, MODEL_PACKAGES),
    "shared_prefix": (check_shared_prefix, MODEL_PACKAGES),
}


def run_checks(checks=CHECKS, small: bool = False, log=print) -> list[Result]:
    """Runs the named checks in order; a failure is recorded and the next check runs."""
    unknown = [c for c in checks if c not in CHECK_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; known: {list(CHECK_FUNCTIONS)}")
    results = []
    for name in checks:
        fn, packages = CHECK_FUNCTIONS[name]
        begin = time.perf_counter()
        missing = missing_packages(packages)
        if missing:
            results.append(Result(name, "MISSING", 0.0, f"missing package(s): {', '.join(missing)}"))
        else:
            log(f"[gpu_check] {name} ...")
            try:
                results.append(Result(name, "PASS", 0.0, fn(small)))
            except CheckFailed as error:
                results.append(Result(name, "FAIL", 0.0, str(error)))
            except ImportError as error:
                results.append(Result(name, "MISSING", 0.0, f"missing package: {error.name or error}"))
            except Exception as error:  # noqa: BLE001 - a crash is this check's failure, not the end of the run
                traceback.print_exc()
                results.append(Result(name, "FAIL", 0.0, f"{type(error).__name__}: {error}"))
        results[-1].seconds = time.perf_counter() - begin
        log(f"[gpu_check] {name}: {results[-1].status} ({results[-1].seconds:.1f} s) {results[-1].detail}")
    return results


def summary_table(results: list[Result], header: str) -> str:
    rows = [("check", "result", "seconds", "detail")]
    rows += [(r.check, r.status, f"{r.seconds:.1f}", r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [header]
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
        if k == 0:
            lines.append("  ".join("-" * width for width in widths) + "  " + "-" * 6)
    return "\n".join(lines)


def platform_header() -> str:
    import jax

    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    return (
        f"platform {devices[0].platform}: {len(devices)} device(s) ({', '.join(kinds)}); jax {jax.__version__}, "
        f"python {sys.version.split()[0]}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="smallest sizes (a CPU run in about a minute)")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    parser.add_argument("--json", default="", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    checks = tuple(c for c in args.checks.split(",") if c)
    unknown = [c for c in checks if c not in CHECK_FUNCTIONS]
    if unknown:
        parser.error(f"--checks: unknown {unknown}; known: {','.join(CHECK_FUNCTIONS)}")
    missing = missing_packages(MODEL_PACKAGES)
    if missing:
        print(
            f"[gpu_check] missing package(s) the model code needs: {', '.join(missing)}. Put their wheels in "
            "launch/wheels/ (launch/gpu_check.sh installs them with pip --no-index) or install them.",
            file=sys.stderr,
        )
        return 2
    header = platform_header()
    print(f"[gpu_check] {header}")
    begin = time.perf_counter()
    results = run_checks(checks, small=args.small)
    print()
    print(summary_table(results, f"{header}; total {time.perf_counter() - begin:.1f} s"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"platform": header, "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)
    if any(r.status == "FAIL" for r in results):
        return 1
    return 2 if any(r.status == "MISSING" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
