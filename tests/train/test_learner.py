"""Tests of the Learner on tiny random Qwen3 / Qwen3-VL models (CPU).

Learners are expensive to compile, so one token-mean learner is shared by several tests;
each test starts from its initial train state (`load_train_state`).
"""

import dataclasses

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.models.qwen3 import Qwen3ForCausalLM, tiny_qwen3_config
from cua_jax.models.scoring import score_sequences
from cua_jax.models.sharding import MeshConfig, make_mesh
from cua_jax.rl.losses import AGGREGATION_MODES, GAP_QUANTILE, PolicyLossConfig, normalize
from cua_jax.train.batching import BatchingConfig, MultimodalPositions, TrainBatch, collate, make_minibatches
from cua_jax.train.learner import (
    Learner,
    LearnerConfig,
    OptimizerConfig,
    SupervisedLossMetrics,
    learning_rate_schedule,
    make_optimizer,
    supervised_loss,
)
from cua_jax.types import ImageSpan, TrainingItem
from tests.support.models import SMALL_QWEN3

ROWS = 4
LENGTH = 32


def small_model(seed: int = 0) -> Qwen3ForCausalLM:
    return Qwen3ForCausalLM(tiny_qwen3_config(**SMALL_QWEN3), rngs=nnx.Rngs(seed))


def make_items(seed: int, num_groups: int = 4, group_size: int = 2) -> tuple[list[TrainingItem], np.ndarray]:
    """Items of 12..32 tokens whose second half is trained, with zero-sum advantages per group."""
    rng = np.random.default_rng(seed)
    items, adv = [], []
    for g in range(num_groups):
        group_adv = rng.normal(size=group_size)
        group_adv -= group_adv.mean()
        for k in range(group_size):
            n = int(rng.integers(12, LENGTH + 1))
            ids = rng.integers(3, SMALL_QWEN3["vocab_size"], n).astype(np.int32)
            mask = np.zeros(n, np.int32)
            mask[n // 2 + int(rng.integers(0, 3)) :] = 1
            logp = np.where(mask > 0, rng.uniform(-5.5, -4.0, n), 0.0).astype(np.float32)
            items.append(TrainingItem(ids, mask, logp, [], f"ep{g}-{k}", g, (0,)))
            adv.append(group_adv[k])
    return items, np.asarray(adv, np.float32)


def optimizer(**kw) -> OptimizerConfig:
    # A large Adam eps keeps the first update a smooth function of the gradient, so two
    # gradients equal to float32 rounding give parameters equal to rounding too (with eps
    # 1e-8, a coordinate whose gradient is ~1e-9 moves by +-lr depending on its rounding).
    return OptimizerConfig(**{"learning_rate": 1e-2, "eps": 1e-3, "max_grad_norm": 1.0, **kw})


def copy_state(learner: Learner):
    return jax.tree.map(jnp.copy, learner.train_state())


def assert_trees_close(a, b, rtol, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def token_mean_learner():
    """(learner, its initial train state): token_mean, rollout old logprobs, k3 KL."""
    config = LearnerConfig(optimizer=optimizer(), loss=PolicyLossConfig(aggregation="token_mean", kl_coef=1e-2))
    learner = Learner(small_model(), config)
    return learner, copy_state(learner)


@pytest.fixture(scope="module")
def batch_items():
    return make_items(seed=1)


def test_updates_reduce_the_loss_on_a_fixed_batch(token_mean_learner, batch_items):
    learner, initial = token_mean_learner
    learner.load_train_state(initial)
    items, adv = batch_items
    [micro] = make_minibatches(items, adv, BatchingConfig(rows=ROWS, length_multiple=LENGTH), 1)
    micro = learner.prepare(micro)
    losses = [learner.update(micro)["loss"] for _ in range(4)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 1e-3, losses
    assert int(learner.step) == 4


def test_accumulated_gradient_equals_full_batch_gradient(token_mean_learner, batch_items):
    """Accumulating over 2 micro-batches vs 1: same loss, same denominator, same gradient."""
    learner, initial = token_mean_learner
    learner.load_train_state(initial)
    items, adv = batch_items
    cfg = BatchingConfig(rows=ROWS, length_multiple=LENGTH)
    full = [collate(items[:4], adv[:4], cfg, length=LENGTH)]
    split = [collate(items[:2], adv[:2], cfg, length=LENGTH), collate(items[2:4], adv[2:4], cfg, length=LENGTH)]
    g_full, m_full = learner.gradients(full)
    g_split, m_split = learner.gradients(split)
    assert m_full["loss_denominator"] == m_split["loss_denominator"] > 0
    np.testing.assert_allclose(m_split["loss"], m_full["loss"], rtol=1e-5)
    assert_trees_close(g_split, g_full, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
def test_microbatch_accumulation_equals_full_batch_update(aggregation, token_mean_learner, batch_items):
    """Params after one step on 4 items in one micro-batch == on the same items in two
    micro-batches (2 items + 2 padding rows each), for every aggregation mode."""
    if aggregation == "token_mean":
        learner, initial = token_mean_learner
    else:
        loss = PolicyLossConfig(
            aggregation=aggregation,
            kl_coef=1e-2,
            fixed_denominator=float(LENGTH) if aggregation == "fixed_denominator" else None,
        )
        learner = Learner(small_model(), LearnerConfig(optimizer=optimizer(), loss=loss))
        initial = copy_state(learner)
    items, adv = batch_items
    cfg = BatchingConfig(rows=ROWS, length_multiple=LENGTH)
    full = [collate(items[:4], adv[:4], cfg, length=LENGTH)]
    split = [collate(items[:2], adv[:2], cfg, length=LENGTH), collate(items[2:4], adv[2:4], cfg, length=LENGTH)]

    learner.load_train_state(initial)
    m_full = learner.update(full)
    p_full = jax.tree.map(jnp.copy, learner.params)
    learner.load_train_state(initial)
    m_split = learner.update(split)
    # The update moved the parameters by ~lr = 1e-2; they agree to float32 rounding of that.
    assert_trees_close(learner.params, p_full, rtol=1e-5, atol=1e-6)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p_full), jax.tree.leaves(initial["params"])))
    for key in ("loss", "grad_norm", "loss_denominator", "clipfrac", "ratio_mean", "entropy", "ref_kl"):
        np.testing.assert_allclose(m_split[key], m_full[key], rtol=1e-5, atol=1e-7, err_msg=key)


def test_on_policy_step_has_ratio_exactly_one_and_no_clipping(batch_items):
    # TIS on: it weights tokens but leaves the ratio (current / current) exactly 1.
    config = LearnerConfig(
        optimizer=optimizer(),
        old_logprobs="current",
        loss=PolicyLossConfig(kl_coef=1e-4, aggregation="token_mean", tis_cap=1.5),
    )
    learner = Learner(small_model(seed=3), config)
    items, adv = batch_items
    [micro] = make_minibatches(items, adv * 10.0, BatchingConfig(rows=ROWS, length_multiple=LENGTH), 1)
    for _ in range(2):  # also after an update moved the policy
        m = learner.update(micro)
        assert m["ratio_mean"] == 1.0 and m["ratio_min"] == 1.0 and m["ratio_max"] == 1.0
        assert m["clipfrac"] == 0.0 and m["clipfrac_low"] == 0.0 and m["clipfrac_high"] == 0.0
        assert m["clipfrac_dual"] == 0.0 and m["ppo_kl"] == 0.0
        assert np.isfinite(m["loss"]) and m["grad_norm"] > 0
        assert m["rollout_logprob_gap"] > 0  # the items' logprobs are not the model's
        assert m["rollout_logprob_gap"] < m["rollout_logprob_gap_p99"] <= m["rollout_logprob_gap_max"]
        # The items' logprobs (uniform in [-5.5, -4]) straddle the model's (~log 1/128 = -4.85),
        # so some weights exp(current - rollout) pass the cap 1.5 and others do not.
        assert 0 < m["tis_capped_frac"] < 1 and 0 < m["tis_weight_mean"] < 1.5


TIS_CAP = 1.05


def test_rollout_mismatch_metrics_and_tis_weights_against_the_learners_own_logprobs(batch_items):
    """With the engine's logprobs equal to the learner's, the gap is ~0 and every TIS weight is
    1; perturbed by known amounts, the reported gap statistics and weights are those amounts'."""
    config = LearnerConfig(
        optimizer=optimizer(),
        old_logprobs="recompute",
        loss=PolicyLossConfig(kl_coef=0.0, aggregation="token_mean", tis_cap=TIS_CAP),
    )
    learner = Learner(small_model(seed=6), config)
    items, adv = batch_items
    [micro] = make_minibatches(items, adv, BatchingConfig(rows=ROWS, length_multiple=LENGTH), 1)
    micro = learner.prepare(micro)  # old_logprobs: the learner's own
    assert len(micro) == 2
    masks = [np.asarray(b.loss_mask) > 0 for b in micro]
    olds = [np.asarray(b.old_logprobs) for b in micro]

    def with_rollout(deltas):
        return [
            b.replace(rollout_logprobs=jnp.asarray(np.where(m, o + d, 0.0).astype(np.float32)))
            for b, m, o, d in zip(micro, masks, olds, deltas)
        ]

    _, same = learner.gradients(with_rollout([0.0, 0.0]))
    # The scoring and the gradient programs round differently, by ~1e-6.
    for key in ("rollout_logprob_gap", "rollout_logprob_gap_p99", "rollout_logprob_gap_max"):
        assert 0 <= same[key] < 1e-5, key
    # The weight compares the old logprobs with the engine's: the same arrays here.
    assert same["tis_capped_frac"] == 0.0 and same["tis_weight_mean"] == 1.0

    # Perturbations away from the cap's threshold log(1.05) = 0.049, and one of 0.5 in the
    # second micro-batch: the maximum is taken across micro-batches.
    rng = np.random.default_rng(7)
    deltas = [np.where(m, rng.choice([-0.1, -0.02, 0.02, 0.1], size=m.shape), 0.0) for m in masks]
    row, col = np.argwhere(masks[1])[0]
    deltas[1][row, col] = -0.5
    _, perturbed = learner.gradients(with_rollout(deltas))
    on = np.concatenate([m.ravel() for m in masks])
    delta = np.concatenate([d.ravel() for d in deltas])[on]
    np.testing.assert_allclose(perturbed["rollout_logprob_gap_max"], 0.5, atol=1e-5)
    np.testing.assert_allclose(perturbed["rollout_logprob_gap"], np.abs(delta).mean(), atol=1e-5)
    p99 = max(np.quantile(np.abs(d)[m], GAP_QUANTILE) for d, m in zip(deltas, masks))
    np.testing.assert_allclose(perturbed["rollout_logprob_gap_p99"], p99, atol=1e-5)
    # TIS weight exp(old - rollout) = exp(-delta), capped at 1.05: the -0.1 and -0.5 tokens.
    raw = np.exp(-delta)
    weight = np.minimum(raw, TIS_CAP)
    assert 0 < np.mean(raw > TIS_CAP) < 1
    np.testing.assert_allclose(perturbed["tis_capped_frac"], np.mean(raw > TIS_CAP), rtol=1e-6)
    np.testing.assert_allclose(perturbed["tis_weight_mean"], weight.mean(), rtol=1e-5)
    # The weights multiply the policy-gradient terms: with the ratio 1 (to rounding; the params
    # are the old ones) and no KL or entropy term, the token-mean loss is mean(-A w).
    adv_tok = np.concatenate([np.asarray(b.advantages).ravel() for b in micro])[on]
    np.testing.assert_allclose(same["loss"], np.mean(-adv_tok), atol=1e-5)
    np.testing.assert_allclose(perturbed["loss"], np.mean(-adv_tok * weight), atol=1e-5)
    assert abs(np.mean(adv_tok * (weight - 1))) > 1e-4  # so the check above tells weighted from not


def test_reference_and_recomputed_old_logprobs_are_computed_once_per_rollout_batch(batch_items):
    config = LearnerConfig(
        optimizer=optimizer(),
        old_logprobs="recompute",
        loss=PolicyLossConfig(kl_coef=1e-2, aggregation="seq_mean_token_mean"),
    )
    learner = Learner(small_model(seed=4), config)
    items, adv = batch_items
    minibatches = make_minibatches(items, adv, BatchingConfig(rows=2, length_multiple=LENGTH), 2)
    num_micro = sum(len(mb) for mb in minibatches)
    assert len(minibatches) == 2 and num_micro == 4

    prepared = [learner.prepare(mb) for mb in minibatches]
    assert learner.reference_scoring_passes == num_micro
    first = learner.update(prepared[0])
    second = learner.update(prepared[1])
    # Preparing once: the updates re-used the reference and old logprobs.
    assert learner.reference_scoring_passes == num_micro
    # The first update saw the pre-update policy (ratio 1 up to the rounding of two compiled
    # programs); the second one saw old logprobs from before the first update.
    np.testing.assert_allclose([first["ratio_min"], first["ratio_max"]], 1.0, atol=1e-5)
    assert abs(second["ppo_kl"]) > 1e-6 and second["ratio_max"] - second["ratio_min"] > 1e-4
    # Both were scored by the same program before any update, when policy == reference.
    for batch in (b for mb in prepared for b in mb):
        np.testing.assert_array_equal(np.asarray(batch.ref_logprobs), np.asarray(batch.old_logprobs))
        assert np.any(np.asarray(batch.ref_logprobs) != 0)
    # train_on_batch prepares every mini-batch before its first update: one pass per micro-batch.
    learner.reference_scoring_passes = 0
    metrics = learner.train_on_batch(make_minibatches(items, adv, BatchingConfig(rows=2, length_multiple=LENGTH), 2))
    assert len(metrics) == 2 and learner.reference_scoring_passes == num_micro


def test_sharded_update_matches_one_device(token_mean_learner, batch_items):
    """fsdp 4 x tensor 2 over 8 CPU devices vs one device: params after a step agree to
    float32 reduction-order rounding (rtol 1e-5, atol 1e-6)."""
    assert len(jax.devices()) >= 8, "tests/conftest.py provides 8 host devices"
    single, initial = token_mean_learner
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2), devices=jax.devices()[:8])
    sharded = Learner(small_model(), single.config, mesh=mesh)
    kernel = sharded.params["model"]["layers"][0]["mlp"]["gate_proj"]["kernel"]
    assert len(kernel.sharding.device_set) == 8 and not kernel.sharding.is_fully_replicated
    items, adv = batch_items
    [micro] = make_minibatches(items, adv, BatchingConfig(rows=ROWS, length_multiple=LENGTH), 1)
    single.load_train_state(initial)
    m_single = single.update(micro)
    m_sharded = sharded.update(micro)
    assert_trees_close(sharded.params, single.params, rtol=1e-5, atol=1e-6)
    for key in ("loss", "grad_norm", "ratio_mean", "entropy"):
        np.testing.assert_allclose(m_sharded[key], m_single[key], rtol=1e-5, err_msg=key)


# -- the supervised objective -------------------------------------------------------------------

B, T = 4, 6  # fixed shapes: one compilation for all hypothesis examples


def _floats(low, high, shape):
    elements = st.floats(float(np.float32(low)), float(np.float32(high)), width=32, allow_subnormal=False)
    return hnp.arrays(np.float32, shape, elements=elements)


@jax.jit
def _jitted_supervised_loss(logp, mask, entropy):
    out = supervised_loss(logp, mask, entropy)
    return normalize(out.numerator, out.denominator), out, out.metrics.summary()


@settings(max_examples=30, deadline=None)
@given(_floats(-8, 0, (B, T)), hnp.arrays(np.int32, (B, T), elements=st.integers(0, 1)), _floats(0, 3, (B, T)))
def test_supervised_loss_matches_numpy(logp, mask, entropy):
    """Compiled: numerator -sum, denominator count, NLL their ratio (0 without tokens), mean entropy;
    masked-out entries (here -inf) touch neither the values nor the gradient."""
    logp_out = np.where(mask != 0, logp, -np.inf).astype(np.float32)
    nll, out, summary = _jitted_supervised_loss(logp_out, mask, entropy)
    on = mask != 0
    count = int(on.sum())
    np.testing.assert_allclose(float(out.numerator), -logp[on].astype(np.float64).sum(), rtol=1e-5, atol=1e-5)
    assert float(out.denominator) == count == float(summary["num_tokens"])
    expected = -logp[on].astype(np.float64).mean() if count else 0.0
    np.testing.assert_allclose(float(nll), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(summary["entropy"]), entropy[on].mean() if count else 0.0, rtol=1e-5, atol=1e-6)
    grad = jax.jit(jax.grad(lambda x: supervised_loss(x, mask).numerator))(logp_out)
    np.testing.assert_array_equal(np.asarray(grad), -on.astype(np.float32))


def test_supervised_loss_accumulates_over_rows_and_rejects_bad_shapes():
    rng = np.random.default_rng(0)
    logp = -rng.exponential(size=(B, T)).astype(np.float32)
    mask = (rng.random((B, T)) < 0.5).astype(np.int32)
    full = supervised_loss(logp, mask)
    top, bottom = supervised_loss(logp[:2], mask[:2]), supervised_loss(logp[2:], mask[2:])
    np.testing.assert_allclose(float(top.numerator + bottom.numerator), float(full.numerator), rtol=1e-6)
    assert float(top.denominator + bottom.denominator) == float(full.denominator)
    assert top.metrics.merge(bottom.metrics) == full.metrics
    assert SupervisedLossMetrics.empty().merge(full.metrics) == full.metrics
    with pytest.raises(ValueError, match=r"logp must be \[B, T\]"):
        supervised_loss(logp[0], mask[0])
    with pytest.raises(ValueError, match="loss_mask has shape"):
        supervised_loss(logp, mask[:, :2])


def _reference_sft_step(model, batch: TrainBatch, config: OptimizerConfig, steps: int):
    """The supervised step written out: value_and_grad of the token-mean NLL of the loss-mask
    tokens, then the optimizer, on the model's Params; (losses, params)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(config)

    def nll(p):
        logp, _ = score_sequences(nnx.merge(graphdef, p, rest), batch.ids, batch.segment_ids, batch.positions)
        mask = batch.loss_mask != 0
        return -jnp.sum(jnp.where(mask, logp, 0.0)) / jnp.sum(mask)

    @jax.jit
    def step(p, state):
        loss, grads = jax.value_and_grad(nll)(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    state, losses = tx.init(params), []
    for _ in range(steps):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    return losses, params


def test_sft_objective_steps_as_the_written_out_nll_step_and_accumulates_exactly(batch_items):
    """objective="sft": no reference kept and nothing prepared; the Learner's steps give the
    losses and parameters of a plain optax step on the token-mean NLL (to float32 rounding),
    two micro-batches give the one-batch step, and `evaluate` is the pooled NLL of `score`."""
    items, _ = batch_items
    cfg = BatchingConfig(rows=ROWS, length_multiple=LENGTH)
    ones = np.ones(4, np.float32)
    full = collate(items[:4], ones, cfg, length=LENGTH)
    split = [collate(items[:2], ones[:2], cfg, length=LENGTH), collate(items[2:4], ones[2:], cfg, length=LENGTH)]
    # The defaults would keep a KL reference and recompute old logprobs for policy gradient.
    config = LearnerConfig(
        objective="sft",
        optimizer=optimizer(warmup_steps=1),
        old_logprobs="recompute",
        loss=PolicyLossConfig(kl_coef=1.0),
    )
    learner = Learner(small_model(), config)
    assert learner.reference_params is None
    [prepared] = learner.prepare([full])
    assert prepared.old_logprobs is None and prepared.ref_logprobs is None and learner.reference_scoring_passes == 0

    initial = copy_state(learner)
    nll = learner.evaluate(iter(split))
    logp = np.concatenate([learner.score(b) for b in split])
    mask = np.concatenate([np.asarray(b.loss_mask) for b in split]) != 0
    np.testing.assert_allclose(nll["loss"], -logp[mask].mean(), rtol=1e-5)
    assert nll["loss_denominator"] == nll["num_tokens"] == mask.sum()

    metrics = [learner.update([full]) for _ in range(2)]
    losses, params = _reference_sft_step(small_model(), full, config.optimizer, steps=2)
    np.testing.assert_allclose([m["loss"] for m in metrics], losses, rtol=1e-6)
    assert metrics[0]["learning_rate"] < metrics[1]["learning_rate"]  # the warmup
    assert {"loss", "grad_norm", "learning_rate", "loss_denominator", "entropy", "num_tokens"} == set(metrics[0])
    assert_trees_close(learner.params, params, rtol=1e-5, atol=1e-6)

    learner.load_train_state(initial)
    learner.update([full])
    one_batch = jax.tree.map(jnp.copy, learner.params)
    learner.load_train_state(initial)
    learner.update(split)
    assert_trees_close(learner.params, one_batch, rtol=1e-5, atol=1e-6)


def test_learning_rate_schedule_warmup_then_cosine():
    cfg = OptimizerConfig(learning_rate=1.0, schedule="cosine", warmup_steps=4, decay_steps=10, min_lr_ratio=0.1)
    lr = jax.jit(learning_rate_schedule(cfg))
    values = [float(lr(s)) for s in range(16)]
    np.testing.assert_allclose(values[0], 1.0 / 5, rtol=1e-6)
    assert all(a < b for a, b in zip(values[:4], values[1:5]))
    np.testing.assert_allclose(values[4], 1.0, rtol=1e-6)
    assert all(a >= b for a, b in zip(values[4:], values[5:]))
    np.testing.assert_allclose(values[14], 0.1, rtol=1e-5)
    constant = learning_rate_schedule(dataclasses.replace(cfg, schedule="constant", warmup_steps=0))
    assert float(constant(7)) == 1.0


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="old_logprobs"):
        LearnerConfig(old_logprobs="stale")
    with pytest.raises(ValueError, match="objective"):
        LearnerConfig(objective="dpo")
    assert LearnerConfig.from_dict({"objective": "sft"}).objective == "sft"
    with pytest.raises(ValueError, match="schedule"):
        OptimizerConfig(schedule="linear")
    with pytest.raises(ValueError, match="unknown learner.optimizer config keys"):
        LearnerConfig.from_dict({"optimizer": {"lr": 1.0}})
    cfg = LearnerConfig.from_dict(
        {"optimizer": {"learning_rate": 3e-6}, "loss": {"kl_coef": 0.0}, "old_logprobs": "current"}
    )
    assert cfg.optimizer.learning_rate == 3e-6 and cfg.loss.kl_coef == 0.0
    with pytest.raises(ValueError, match="tis_cap must be 0 .off. or >= 1"):
        LearnerConfig.from_dict({"loss": {"tis_cap": 0.5}})
    assert LearnerConfig.from_dict({"loss": {"tis_cap": 2.0}}).loss.tis_cap == 2.0
    with pytest.raises(ValueError, match="no vision tower"):
        Learner(small_model(), LearnerConfig(freeze_vision=True))


def test_frozen_vision_tower_is_bit_identical_after_a_step():
    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config

    VISION = nnx.All(nnx.Param, nnx.PathContains("visual"))
    vl_config = tiny_qwen3_vl_config()
    vl_config = dataclasses.replace(  # one decoder layer, one vision block feeding it DeepStack features
        vl_config,
        text=dataclasses.replace(vl_config.text, num_hidden_layers=1),
        vision=dataclasses.replace(vl_config.vision, depth=1, deepstack_visual_indexes=(0,)),
    )
    model = Qwen3VLForConditionalGeneration(vl_config, rngs=nnx.Rngs(5))
    vision_before = jax.tree.map(np.array, nnx.state(model, VISION))
    text_before = jax.tree.map(np.array, nnx.state(model.language_model, nnx.Param))
    learner = Learner(
        model, LearnerConfig(optimizer=optimizer(), freeze_vision=True, loss=PolicyLossConfig(kl_coef=0.0))
    )
    rng = np.random.default_rng(0)
    grid = (1, 4, 4)
    patch_dim = vl_config.vision.patch_dim
    items, patches = [], {}
    for k in range(2):
        ids = [5, 6, vl_config.vision_start_token_id] + [vl_config.image_token_id] * 4 + [vl_config.vision_end_token_id]
        start = 3
        ids += list(rng.integers(10, 200, 8))
        ids = np.asarray(ids, np.int32)
        mask = np.zeros(len(ids), np.int32)
        mask[-6:] = 1
        items.append(
            TrainingItem(
                ids,
                mask,
                np.where(mask > 0, -6.0, 0).astype(np.float32),
                [ImageSpan(start, start + 4, 0, 0, grid)],
                f"vl{k}",
                0,
                (0,),
            )
        )
        patches[(f"vl{k}", 0, 0)] = rng.normal(size=(16, patch_dim)).astype(np.float32)
    batch = collate(
        items,
        [1.0, -1.0],
        BatchingConfig(rows=2, length_multiple=16),
        pixel_patches=patches,
        multimodal=MultimodalPositions.of(vl_config),
    )
    metrics = learner.update([batch])
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    # The vision tower is outside the trainable set: no optimizer moments for it.
    assert not any(
        "visual" in "/".join(map(str, path)) for path, _ in jax.tree_util.tree_leaves_with_path(learner.params)
    )
    trainable_size = sum(x.size for x in jax.tree.leaves(learner.params))
    # Adam's two moments for the trainable parameters, plus scalar counters.
    assert 2 * trainable_size <= sum(x.size for x in jax.tree.leaves(learner.opt_state)) < 2 * trainable_size + 16
    vision_after = nnx.state(learner.model, VISION)
    for a, b in zip(jax.tree.leaves(vision_before), jax.tree.leaves(vision_after)):
        np.testing.assert_array_equal(a, np.asarray(b))
    text_after = nnx.state(learner.model.language_model, nnx.Param)
    assert any(
        not np.array_equal(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(text_before), jax.tree.leaves(text_after))
    )


def test_bfloat16_step_keeps_float32_master_weights_and_follows_the_float32_update(batch_items):
    """bfloat16 parameters and compute, layers rematerialised: the step's loss is finite, the
    optimizer state (master weights, Adam moments) is float32, the parameters stay bfloat16 and
    are exactly the rounded master weights, and the update points where the float32 one does
    from the same (bfloat16-rounded) start."""
    from cua_jax.train.learner import MasterWeightsState

    fp32 = small_model()
    bf16 = Qwen3ForCausalLM(
        tiny_qwen3_config(**SMALL_QWEN3, dtype="bfloat16", param_dtype="bfloat16", remat=True), rngs=nnx.Rngs(0)
    )
    rounded = jax.tree.map(lambda a: a.astype(jnp.bfloat16), nnx.state(fp32, nnx.Param))
    nnx.update(bf16, rounded)
    nnx.update(fp32, jax.tree.map(lambda a: a.astype(jnp.float32), rounded))
    config = LearnerConfig(optimizer=optimizer(), loss=PolicyLossConfig(aggregation="token_mean", kl_coef=1e-2))
    items, adv = batch_items
    [micro] = make_minibatches(items, adv, BatchingConfig(rows=ROWS, length_multiple=LENGTH), 1)
    steps, metrics = {}, {}
    for name, model in (("float32", fp32), ("bfloat16", bf16)):
        learner = Learner(model, config)
        start = [np.asarray(a, np.float32) for a in jax.tree.leaves(learner.params)]
        metrics[name] = learner.update(micro)
        state = learner.opt_state
        if name == "float32":
            assert not isinstance(state, MasterWeightsState)
            after = learner.params
        else:
            assert isinstance(state, MasterWeightsState)
            assert {a.dtype for a in jax.tree.leaves(learner.params)} == {jnp.dtype(jnp.bfloat16)}
            assert {a.dtype for a in jax.tree.leaves(learner.reference_params)} == {jnp.dtype(jnp.bfloat16)}
            floats = {a.dtype for a in jax.tree.leaves(state) if jnp.issubdtype(a.dtype, jnp.floating)}
            assert floats == {jnp.dtype(jnp.float32)}
            # master, Adam's two moments: three float32 copies of the trainable parameters
            trainable = sum(a.size for a in jax.tree.leaves(learner.params))
            assert 3 * trainable <= sum(a.size for a in jax.tree.leaves(state)) < 3 * trainable + 16
            for p, m in zip(jax.tree.leaves(learner.params), jax.tree.leaves(state.master)):
                np.testing.assert_array_equal(np.asarray(p), np.asarray(m.astype(jnp.bfloat16)))
            after = state.master
        steps[name] = np.concatenate([(np.asarray(a) - s).ravel() for a, s in zip(jax.tree.leaves(after), start)])
    assert np.isfinite(metrics["bfloat16"]["loss"]) and metrics["bfloat16"]["grad_norm"] > 0
    np.testing.assert_allclose(metrics["bfloat16"]["loss"], metrics["float32"]["loss"], rtol=0.05, atol=1e-3)
    a, b = steps["float32"], steps["bfloat16"]
    assert np.linalg.norm(a) > 1e-3
    assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.99


def test_master_weights_keep_updates_below_bfloat16_resolution():
    """SGD steps of 1e-3 on a bfloat16 weight of 1.0 (spacing 2^-8 just below it): each rounds away
    without master weights; with them, ten steps accumulate to 0.99, rounded 0.98828125 (253 / 256)."""
    import optax

    from cua_jax.train.learner import MasterWeightsState, make_optimizer, with_float32_master_weights

    params = {"w": jnp.ones((4,), jnp.bfloat16)}
    grads = {"w": jnp.ones((4,), jnp.bfloat16)}
    plain, master = optax.sgd(1e-3), with_float32_master_weights(optax.sgd(1e-3))
    p_plain, s_plain = params, plain.init(params)
    p_master, s_master = params, master.init(params)
    for _ in range(10):
        u, s_plain = plain.update(grads, s_plain, p_plain)
        p_plain = optax.apply_updates(p_plain, u)
        u, s_master = master.update(grads, s_master, p_master)
        p_master = optax.apply_updates(p_master, u)
    np.testing.assert_array_equal(np.asarray(p_plain["w"], np.float32), 1.0)
    np.testing.assert_allclose(np.asarray(s_master.master["w"]), 0.99, rtol=1e-6)
    assert p_master["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(p_master["w"], np.float32), 0.98828125)
    with pytest.raises(ValueError, match="needs the current params"):
        master.update(grads, s_master)
    # The learner's optimizer: clipping and AdamW inside the wrapper, state on the float32 copy.
    state = make_optimizer(OptimizerConfig(), master_weights=True).init(params)
    assert isinstance(state, MasterWeightsState)
    assert all(a.dtype != jnp.bfloat16 for a in jax.tree.leaves(state))


def test_run_config_tis_cap_reaches_the_loss_and_a_bad_one_is_named():
    from cua_jax.train.settings import ConfigError, TrainSettings
    from experiments.configs.base import base_config

    config = base_config()
    assert TrainSettings.from_config(config).learner.loss.tis_cap == 0.0  # off by default
    config.loss.tis_cap = 2.0
    assert TrainSettings.from_config(config).learner.loss.tis_cap == 2.0
    config.loss.tis_cap = 0.5
    with pytest.raises(ConfigError, match=r"config\.loss\.tis_cap: .*must be 0 \(off\) or >= 1"):
        TrainSettings.from_config(config)
