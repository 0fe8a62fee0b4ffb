"""The clipped policy loss, KL estimators and loss aggregation against numpy references."""

import dataclasses
import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.rl.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from cua_jax.rl.losses import (
    AGGREGATION_MODES,
    GAP_QUANTILE,
    PolicyLossConfig,
    PolicyLossMetrics,
    behaviour_importance_weight,
    loss_denominator,
    masked_quantile,
    normalize,
    policy_loss,
    truncated_importance_weight,
)

PROPERTY = settings(max_examples=30, deadline=None)

# Fixed shapes, so each (config, function) pair compiles once for all hypothesis examples.
B, T = 8, 6
MAX_TOKENS = 6.0

CONFIGS = {
    mode: PolicyLossConfig(
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        dual_clip_c=3.0,
        kl_coef=0.05,
        kl_estimator="k3",
        entropy_coef=0.01,
        aggregation=mode,
        fixed_denominator=MAX_TOKENS if mode == "fixed_denominator" else None,
    )
    for mode in AGGREGATION_MODES
}
# Plain surrogate (no KL, no entropy), for the on-policy gradient identity.
PG_ONLY = {mode: dataclasses.replace(config, kl_coef=0.0, entropy_coef=0.0) for mode, config in CONFIGS.items()}
# Truncated importance sampling on top of each, at the tightest cap and a typical one.
TIS_CAPS = (1.0, 2.0)
TIS = {(mode, cap): dataclasses.replace(config, tis_cap=cap) for mode, config in CONFIGS.items() for cap in TIS_CAPS}
# AReaL's decoupled objective: the behaviour weight uncapped (0) and capped.
DECOUPLED = {
    (mode, cap): dataclasses.replace(config, surrogate="decoupled", tis_cap=cap)
    for mode, config in CONFIGS.items()
    for cap in (0.0, 2.0)
}
TIS_PG_ONLY = {
    (mode, cap): dataclasses.replace(config, tis_cap=cap) for mode, config in PG_ONLY.items() for cap in TIS_CAPS
}


def floats(low, high, shape):
    # Bounds exact in float32; no subnormals, which XLA on CPU flushes to zero.
    low, high = float(np.float32(low)), float(np.float32(high))
    elements = st.floats(low, high, width=32, allow_subnormal=False)
    return hnp.arrays(np.float32, shape, elements=elements)


LOGP = floats(-5, 0, (B, T))
DELTA = floats(-1.5, 1.5, (B, T))
ENTROPY = floats(0, 3, (B, T))
ITEM_ADV = floats(-3, 3, (B,))
MASK = hnp.arrays(np.int32, (B, T), elements=st.integers(0, 1))
AGGREGATION_MODE = st.sampled_from(AGGREGATION_MODES.names())
# What a policy-loss call takes: current log-probs, old = logp - delta, ref = logp + ref_delta.
LOSS_INPUTS = dict(
    logp=LOGP, delta=DELTA, ref_delta=DELTA, entropy=ENTROPY, adv=ITEM_ADV, mask=MASK, mode=AGGREGATION_MODE
)
TIS_CAP = st.sampled_from(TIS_CAPS)
# What a truncated-importance-sampling check takes: rollout = old - rollout_delta, and a cap.
TIS_INPUTS = dict(logp=LOGP, rollout_delta=DELTA, adv=ITEM_ADV, mask=MASK, mode=AGGREGATION_MODE, cap=TIS_CAP)


def loss_and_metrics(logp, old_logp, advantages, mask, ref_logp, rollout_logp, entropy, config):
    out = policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        config,
        ref_logp=ref_logp,
        rollout_logp=rollout_logp,
        entropy=entropy,
    )
    return normalize(out.numerator, out.denominator), out


@functools.cache
def jitted_loss(config):
    return jax.jit(functools.partial(loss_and_metrics, config=config))


@functools.cache
def jitted_loss_grad(config):
    """(loss, grad wrt logp) of the normalised loss."""

    def value(logp, *rest):
        return loss_and_metrics(logp, *rest, config=config)[0]

    return jax.jit(jax.value_and_grad(value))


@functools.cache
def jitted_numerator_grad(config):
    """(PolicyLossOutput, grad of the numerator wrt logp): one micro-batch's contribution."""

    def numerator(logp, *rest):
        out = loss_and_metrics(logp, *rest, config=config)[1]
        return out.numerator, out

    return jax.jit(jax.value_and_grad(numerator, has_aux=True))


def reference_tis_weight(old_logp, rollout_logp, cap):
    """(weight, capped) of truncated importance sampling, in float64."""
    raw = np.exp(np.asarray(old_logp, np.float64) - np.asarray(rollout_logp, np.float64))
    return np.minimum(raw, cap), raw > cap


def reference_quantile(values, mask, q, empty=0.0):
    selected = np.asarray(values, np.float64)[np.asarray(mask) != 0]
    return float(np.quantile(selected, q)) if selected.size else empty


def reference_per_token(logp, old_logp, adv, ref_logp, entropy, config, tis_weight=1.0):
    logp, old_logp, ref_logp, entropy = (np.asarray(x, np.float64) for x in (logp, old_logp, ref_logp, entropy))
    adv = np.broadcast_to(np.asarray(adv, np.float64)[:, None], logp.shape) if np.ndim(adv) == 1 else adv
    ratio = np.exp(logp - old_logp)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - config.clip_eps_low, 1 + config.clip_eps_high) * adv)
    if config.dual_clip_c is not None:
        surrogate = np.where(adv < 0, np.maximum(surrogate, config.dual_clip_c * adv), surrogate)
    surrogate = surrogate * tis_weight
    r = ref_logp - logp
    kl = {"k1": -r, "k2": 0.5 * r**2, "k3": np.exp(r) - r - 1}[config.kl_estimator]
    return -surrogate + config.kl_coef * kl - config.entropy_coef * entropy, ratio, adv, kl


def reference_aggregate(per_token, mask, config):
    mask = np.asarray(mask, np.float64)
    rows = [b for b in range(mask.shape[0]) if mask[b].sum() > 0]
    if not rows:
        return 0.0
    sums = (per_token * mask).sum(axis=1)
    if config.aggregation == "token_mean":
        return sums.sum() / mask.sum()
    if config.aggregation == "seq_mean_token_mean":
        return np.mean([sums[b] / mask[b].sum() for b in rows])
    if config.aggregation == "seq_mean_token_sum":
        return np.mean([sums[b] for b in rows])
    return sums.sum() / (len(rows) * config.fixed_denominator)


@PROPERTY
@given(**LOSS_INPUTS)
def test_policy_loss_matches_reference(logp, delta, ref_delta, entropy, adv, mask, mode):
    config = CONFIGS[mode]
    old_logp, ref_logp, rollout_logp = logp - delta, logp + ref_delta, logp - 0.5 * delta
    loss, out = jitted_loss(config)(logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy)
    per_token, ratio, adv_tok, kl = reference_per_token(logp, old_logp, adv, ref_logp, entropy, config)
    np.testing.assert_allclose(loss, reference_aggregate(per_token, mask, config), rtol=2e-5, atol=2e-5)

    on = mask > 0
    n = max(on.sum(), 1)
    metrics = out.metrics.summary()
    low, high = 1 - config.clip_eps_low, 1 + config.clip_eps_high
    binding = {
        "low": (adv_tok < 0, low, ratio < low),
        "high": (adv_tok > 0, high, ratio > high),
        "dual": (adv_tok < 0, 3.0, ratio > 3.0),
    }
    for name, (side, bound, past) in binding.items():
        # float32 and float64 ratios may fall on either side of a bound they (nearly) touch.
        unsure = np.sum(on & side & np.isclose(ratio, bound, rtol=1e-5, atol=0))
        want = np.sum(on & side & past) / n
        np.testing.assert_allclose(metrics[f"clipfrac_{name}"], want, atol=unsure / n + 1e-7)
    means = {
        "ppo_kl": -delta,
        "ref_kl": kl,
        "entropy": entropy,
        "rollout_logprob_gap": 0.5 * np.abs(delta),
    }
    for name, values in means.items():
        np.testing.assert_allclose(metrics[name], np.sum(values * on) / n, rtol=1e-4, atol=1e-5, err_msg=name)
    # Ratio statistics over no token at all read as the on-policy value 1.
    seen = ratio[on] if on.any() else np.ones(1)
    np.testing.assert_allclose(metrics["ratio_mean"], seen.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_min"], seen.min(), rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_max"], seen.max(), rtol=1e-5)
    assert float(metrics["num_tokens"]) == on.sum()
    gap = 0.5 * np.abs(delta.astype(np.float64))
    # atol: XLA flushes float32 subnormals (a gap of 5.9e-39 reads 0).
    np.testing.assert_allclose(
        metrics["rollout_logprob_gap_max"], gap[on].max() if on.any() else 0.0, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        metrics["rollout_logprob_gap_p99"], reference_quantile(gap, on, GAP_QUANTILE), rtol=1e-5, atol=1e-6
    )
    # TIS is off: every token has weight 1.
    assert float(metrics["tis_capped_frac"]) == 0.0 and float(metrics["tis_weight_mean"]) == 1.0


@PROPERTY
@given(logp=LOGP, adv=ITEM_ADV, mask=MASK, mode=AGGREGATION_MODE)
def test_on_policy_ratio_is_one_nothing_clips_and_gradient_is_plain_policy_gradient(logp, adv, mask, mode):
    config = PG_ONLY[mode]
    old_logp = logp.copy()  # the policy that sampled is the policy being trained
    (loss, out) = jitted_loss(config)(logp, old_logp, adv, mask, None, None, None)
    metrics = out.metrics.summary()
    for name in ("clipfrac_low", "clipfrac_high", "clipfrac_dual", "clipfrac", "ppo_kl"):
        assert float(metrics[name]) == 0.0, name
    for name in ("ratio_min", "ratio_mean", "ratio_max"):
        assert float(metrics[name]) == 1.0, name

    _, grad = jitted_loss_grad(config)(logp, old_logp, adv, mask, None, None, None)
    # Plain policy gradient of the same aggregation: d/dlogp [-A logp] weighted per token.
    want = -adv[:, None] * reference_token_weights(mask, mode)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def reference_token_weights(mask, mode):
    """[B, T]: d loss / d (per-token loss) under each aggregation (0 off the mask)."""
    m = mask.astype(np.float64)
    tokens = m.sum(axis=1)
    rows = max((tokens > 0).sum(), 1)
    weight = {
        "token_mean": np.full(B, 1 / max(m.sum(), 1)),
        "seq_mean_token_mean": 1 / (np.maximum(tokens, 1) * rows),
        "seq_mean_token_sum": np.full(B, 1 / rows),
        "fixed_denominator": np.full(B, 1 / (rows * MAX_TOKENS)),
    }[mode]
    return m * weight[:, None]


@PROPERTY
@given(**LOSS_INPUTS, num_micro=st.sampled_from([2, 4]))
def test_micro_batch_accumulation_equals_full_batch(logp, delta, ref_delta, entropy, adv, mask, mode, num_micro):
    config = CONFIGS[mode]
    args = (logp - delta, adv, mask, logp + ref_delta, logp - 0.5 * delta, entropy)
    full_loss, full_grad = jitted_loss_grad(config)(logp, *args)
    _, full_out = jitted_loss(config)(logp, *args)

    size = B // num_micro
    numerator, denominator, grads, metrics = 0.0, 0.0, [], None
    for start in range(0, B, size):
        rows = slice(start, start + size)
        (_, out), grad = jitted_numerator_grad(config)(logp[rows], *(a[rows] for a in args))
        numerator += out.numerator
        denominator += out.denominator
        grads.append(grad)
        metrics = out.metrics if metrics is None else metrics.merge(out.metrics)

    np.testing.assert_allclose(normalize(numerator, denominator), full_loss, rtol=1e-5, atol=1e-6)
    # The denominator does not depend on the parameters: divide the summed gradients once.
    accumulated = np.concatenate(grads) / max(float(denominator), 1.0)
    np.testing.assert_allclose(accumulated, full_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(denominator, loss_denominator_jit[mode](mask), rtol=1e-6)
    full_metrics, merged = full_out.metrics.summary(), metrics.summary()
    for name, value in full_metrics.items():
        if name != "rollout_logprob_gap_p99":
            np.testing.assert_allclose(merged[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # A quantile does not combine: merged, it is the largest micro-batch quantile.
    gap, size = 0.5 * np.abs(delta.astype(np.float64)), B // num_micro
    per_micro = [reference_quantile(gap[s : s + size], mask[s : s + size], GAP_QUANTILE) for s in range(0, B, size)]
    np.testing.assert_allclose(merged["rollout_logprob_gap_p99"], max(per_micro), rtol=1e-5, atol=1e-6)
    assert float(merged["rollout_logprob_gap_p99"]) <= float(merged["rollout_logprob_gap_max"])


loss_denominator_jit = {
    mode: jax.jit(functools.partial(loss_denominator, config=config)) for mode, config in CONFIGS.items()
}
normalize_jit = jax.jit(normalize)


@PROPERTY
@given(mask=MASK, mode=AGGREGATION_MODE)
def test_loss_denominator_matches_reference(mask, mode):
    rows = (mask.sum(axis=1) > 0).sum()
    want = {
        "token_mean": mask.sum(),
        "seq_mean_token_mean": rows,
        "seq_mean_token_sum": rows,
        "fixed_denominator": rows * MAX_TOKENS,
    }[mode]
    assert float(loss_denominator_jit[mode](mask)) == want


def test_normalize_is_zero_for_an_empty_batch():
    assert float(normalize_jit(jnp.float32(3.0), jnp.float32(0.0))) == 0.0
    assert float(normalize_jit(jnp.float32(3.0), jnp.float32(4.0))) == 0.75


@PROPERTY
@given(logp=LOGP, delta=floats(-3, 3, (B, T)), adv=floats(-3, -0.01, (B,)))
def test_dual_clip_caps_the_loss_of_negative_advantage_tokens(logp, delta, adv):
    config = PG_ONLY["seq_mean_token_sum"]
    mask = np.zeros((B, T), np.int32)
    mask[:, 0] = 1  # one token per item, so each item's loss is that token's loss
    (_, out) = jitted_loss(config)(logp, logp - delta, adv, mask, None, None, None)
    ratio = np.exp(delta[:, 0].astype(np.float64))
    # Every per-item loss is at most c |A|; the sum over items checks each since the bound is tight per item.
    per_item = -adv * np.minimum(np.maximum(ratio, 1 - config.clip_eps_low), config.dual_clip_c)
    np.testing.assert_allclose(out.numerator, per_item.sum(), rtol=1e-5, atol=1e-5)
    assert float(out.numerator) <= float(np.sum(-adv) * config.dual_clip_c) * (1 + 1e-6)


def test_dual_clip_zeroes_the_gradient_past_the_cap():
    logp = jnp.zeros((B, T))
    old_logp = logp - 2.0  # ratio e^2 = 7.39 > c = 3
    adv = -jnp.ones(B)
    mask = jnp.ones((B, T), jnp.int32)
    capped = PG_ONLY["token_mean"]
    loss, grad = jitted_loss_grad(capped)(logp, old_logp, adv, mask, None, None, None)
    np.testing.assert_allclose(loss, 3.0, rtol=1e-6)
    assert np.all(np.asarray(grad) == 0.0)
    _, out = jitted_loss(capped)(logp, old_logp, adv, mask, None, None, None)
    assert float(out.metrics.summary()["clipfrac_dual"]) == 1.0

    uncapped = dataclasses.replace(capped, dual_clip_c=None)
    loss, grad = jitted_loss_grad(uncapped)(logp, old_logp, adv, mask, None, None, None)
    np.testing.assert_allclose(loss, np.exp(2.0), rtol=1e-6)
    assert np.all(np.asarray(grad) > 0)


# Truncated importance sampling and the rollout-vs-learner gap.

masked_quantile_jit = jax.jit(masked_quantile)  # q traced: one program for every q
tis_weight_jit = jax.jit(truncated_importance_weight, static_argnames="cap")


@PROPERTY
@given(x=floats(-5, 5, (B, T)), mask=MASK, q=st.sampled_from([0.0, 0.25, 0.5, GAP_QUANTILE, 1.0]))
def test_masked_quantile_matches_numpy_on_the_selected_entries(x, mask, q):
    dirty = np.where(mask > 0, x, np.nan)  # unselected entries may hold anything
    got = masked_quantile_jit(dirty, mask, q)
    # The interpolation position q * (n - 1) is a float32: its rounding (up to n ulps of 1 for
    # n <= B * T) times the gap between two neighbours (up to 10 here) bounds the difference.
    position_error = 10.0 * B * T * np.finfo(np.float32).eps
    np.testing.assert_allclose(got, reference_quantile(x, mask, q), rtol=1e-5, atol=1e-6 + position_error)


def test_masked_quantile_of_no_entry_is_the_empty_value_and_bad_arguments_raise():
    x = jnp.arange(6.0).reshape(2, 3)
    nothing = jnp.zeros((2, 3))
    assert float(masked_quantile_jit(x, nothing, 0.5)) == 0.0
    assert float(jax.jit(functools.partial(masked_quantile, q=0.5, empty=-1.0))(x, nothing)) == -1.0
    one = nothing.at[1, 2].set(1)
    assert float(masked_quantile_jit(x, one, GAP_QUANTILE)) == 5.0
    with pytest.raises(ValueError, match="q must lie in"):
        masked_quantile(x, one, 99)
    with pytest.raises(ValueError, match="mask has shape"):
        masked_quantile(x, jnp.zeros(6), 0.5)


@PROPERTY
@given(old=LOGP, delta=floats(-3, 3, (B, T)), cap=st.sampled_from([1.0, 1.5, 2.0, 10.0]))
def test_truncated_importance_weight_matches_reference(old, delta, cap):
    rollout = old - delta
    weight, capped = tis_weight_jit(old, rollout, cap=cap)
    want, want_capped = reference_tis_weight(old, rollout, cap)
    np.testing.assert_allclose(weight, want, rtol=1e-5)
    assert np.all(np.asarray(weight) <= cap)
    # float32 and float64 may fall on either side of a cap the weight (nearly) equals.
    sure = ~np.isclose(np.exp(old.astype(np.float64) - rollout), cap, rtol=1e-5, atol=0)
    np.testing.assert_array_equal(np.asarray(capped)[sure], want_capped[sure])


def test_truncated_importance_weight_is_a_constant_and_caps_overflow():
    grads = jax.jit(jax.grad(lambda o, r: jnp.sum(truncated_importance_weight(o, r, 2.0)[0]), argnums=(0, 1)))
    old, rollout = jnp.zeros(4), jnp.array([-1.0, -0.1, 0.0, 1.0])
    for g in grads(old, rollout):
        assert np.all(np.asarray(g) == 0.0)
    weight, capped = tis_weight_jit(jnp.zeros(2), jnp.array([-1000.0, 0.0]), cap=2.0)  # exp(1000) overflows
    assert np.asarray(weight).tolist() == [2.0, 1.0] and np.asarray(capped).tolist() == [True, False]


@PROPERTY
@given(**LOSS_INPUTS, rollout_delta=DELTA, cap=TIS_CAP)
def test_tis_weighted_loss_matches_reference(logp, delta, rollout_delta, ref_delta, entropy, adv, mask, mode, cap):
    config = TIS[mode, cap]
    old_logp, ref_logp = logp - delta, logp + ref_delta
    rollout_logp = old_logp - rollout_delta
    loss, out = jitted_loss(config)(logp, old_logp, adv, mask, ref_logp, rollout_logp, entropy)
    weight, capped = reference_tis_weight(old_logp, rollout_logp, cap)
    per_token, *_ = reference_per_token(logp, old_logp, adv, ref_logp, entropy, config, tis_weight=weight)
    np.testing.assert_allclose(loss, reference_aggregate(per_token, mask, config), rtol=2e-5, atol=2e-5)

    on = mask > 0
    n = max(on.sum(), 1)
    metrics = out.metrics.summary()
    raw = np.exp(old_logp.astype(np.float64) - rollout_logp)
    unsure = np.sum(on & np.isclose(raw, cap, rtol=1e-5, atol=0))
    np.testing.assert_allclose(metrics["tis_capped_frac"], np.sum(on & capped) / n, atol=unsure / n + 1e-7)
    np.testing.assert_allclose(metrics["tis_weight_mean"], weight[on].mean() if on.any() else 1.0, rtol=1e-5)
    gap = np.abs(rollout_logp.astype(np.float64) - logp)
    np.testing.assert_allclose(metrics["rollout_logprob_gap"], np.sum(gap * on) / n, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        metrics["rollout_logprob_gap_max"], gap[on].max() if on.any() else 0.0, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        metrics["rollout_logprob_gap_p99"], reference_quantile(gap, on, GAP_QUANTILE), rtol=1e-5, atol=1e-6
    )


@PROPERTY
@given(**LOSS_INPUTS, rollout_delta=DELTA)
def test_tis_off_or_at_agreeing_logprobs_leaves_loss_and_gradient_unchanged(
    logp, delta, rollout_delta, ref_delta, entropy, adv, mask, mode
):
    old_logp = logp - delta
    args = (old_logp, adv, mask, logp + ref_delta)
    plain = jitted_loss_grad(CONFIGS[mode])(logp, *args, None, entropy)
    # Off (tis_cap = 0): the engine's log-probs feed the metrics only.
    off = jitted_loss_grad(CONFIGS[mode])(logp, *args, old_logp - rollout_delta, entropy)
    # On, with the engine's log-probs equal to old_logp (old_logprobs="rollout"): every weight is 1.
    agreeing = jitted_loss_grad(TIS[mode, 2.0])(logp, *args, old_logp, entropy)
    for name, got in (("off", off), ("agreeing", agreeing)):
        for a, b in zip(got, plain):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@PROPERTY
@given(**TIS_INPUTS, delta=DELTA)
def test_tis_scales_each_token_gradient_by_its_weight(logp, delta, rollout_delta, adv, mask, mode, cap):
    old_logp = logp - delta
    rollout_logp = old_logp - rollout_delta
    _, plain = jitted_loss_grad(PG_ONLY[mode])(logp, old_logp, adv, mask, None, None, None)
    _, weighted = jitted_loss_grad(TIS_PG_ONLY[mode, cap])(logp, old_logp, adv, mask, None, rollout_logp, None)
    weight, _ = reference_tis_weight(old_logp, rollout_logp, cap)
    np.testing.assert_allclose(weighted, weight * plain, rtol=1e-5, atol=1e-7)


@functools.cache
def jitted_on_policy_loss_grad(config):
    """((loss, metrics), grad wrt logp) with old_logp = stop_gradient(logp): the learner's
    "current" mode."""

    def value(logp, advantages, mask, rollout_logp):
        out = policy_loss(logp, jax.lax.stop_gradient(logp), advantages, mask, config, rollout_logp=rollout_logp)
        return normalize(out.numerator, out.denominator), out.metrics.summary()

    return jax.jit(jax.value_and_grad(value, has_aux=True))


@PROPERTY
@given(**TIS_INPUTS)
def test_on_policy_tis_weights_the_plain_policy_gradient(logp, rollout_delta, adv, mask, mode, cap):
    config = TIS_PG_ONLY[mode, cap]
    rollout_logp = logp - rollout_delta
    (loss, metrics), grad = jitted_on_policy_loss_grad(config)(logp, adv, mask, rollout_logp)
    # The ratio is exactly 1; the weight is the learner-vs-engine correction alone.
    assert float(metrics["ratio_min"]) == float(metrics["ratio_max"]) == 1.0 and float(metrics["clipfrac"]) == 0.0
    weight, _ = reference_tis_weight(logp, rollout_logp, cap)
    token_weights = reference_token_weights(mask, mode)
    np.testing.assert_allclose(grad, -adv[:, None] * weight * token_weights, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(loss, np.sum(-adv[:, None] * weight * token_weights), rtol=1e-5, atol=1e-6)


kl_jit = {name: jax.jit(fn) for name, fn in KL_ESTIMATORS.items()}


@PROPERTY
@given(logp=floats(-30, 0, (B, T)), ref_logp=floats(-30, 0, (B, T)))
def test_kl_estimators_match_reference_and_k3_is_nonnegative(logp, ref_logp):
    r = ref_logp.astype(np.float64) - logp.astype(np.float64)
    k3 = np.asarray(kl_jit["k3"](logp, ref_logp))
    assert np.all(k3 >= 0)
    np.testing.assert_allclose(k3, np.expm1(r) - r, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(kl_jit["k1"](logp, ref_logp), -r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kl_jit["k2"](logp, ref_logp), 0.5 * r**2, rtol=1e-4, atol=1e-5)
    assert KL_ESTIMATORS == {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def test_kl_estimators_vanish_at_the_reference():
    x = jnp.linspace(-5.0, 0.0, 12)
    for fn in kl_jit.values():
        assert np.all(np.asarray(fn(x, x)) == 0.0)


def test_masked_positions_may_hold_infinities():
    logp = jnp.full((B, T), -jnp.inf).at[:, :3].set(-1.0)
    mask = jnp.zeros((B, T), jnp.int32).at[:, :3].set(1)
    nan_outside = jnp.full((B, T), jnp.nan).at[:, :3].set(-1.2)
    args = (logp + 0.1, jnp.ones(B), mask, nan_outside, nan_outside, nan_outside)
    for mode, config in CONFIGS.items():
        loss, grad = jitted_loss_grad(config)(logp, *args)
        assert np.isfinite(loss) and np.all(np.isfinite(grad)), mode
        assert np.all(np.asarray(grad)[:, 3:] == 0.0)


def test_bfloat16_log_probs_are_counted_in_float32():
    # bf16 counts stall at 256; 600 tokens must be counted exactly.
    logp = jnp.full((2, 300), -1.0, jnp.bfloat16)
    mask = jnp.ones((2, 300), jnp.int32)
    out = jax.jit(functools.partial(policy_loss, config=PG_ONLY["token_mean"]))(logp, logp, jnp.ones(2), mask)
    assert out.numerator.dtype == jnp.float32
    assert float(out.denominator) == 600.0 and float(out.metrics.num_tokens) == 600.0
    np.testing.assert_allclose(normalize(out.numerator, out.denominator), -1.0, rtol=1e-6)


def test_metrics_merge_and_summary_under_jit():
    def stats(x):
        return PolicyLossMetrics(*(jnp.float32(x) for _ in PolicyLossMetrics._fields))

    merged = jax.jit(lambda a, b: a.merge(b).summary())(stats(1.0), stats(3.0))
    assert float(merged["num_tokens"]) == 4.0
    assert float(merged["ratio_min"]) == 1.0 and float(merged["ratio_max"]) == 3.0
    assert float(merged["ratio_mean"]) == 1.0  # (1 + 3) / 4 tokens
    assert float(merged["rollout_logprob_gap_max"]) == 3.0 and float(merged["rollout_logprob_gap_p99"]) == 3.0
    assert float(merged["tis_capped_frac"]) == 1.0 and float(merged["tis_weight_mean"]) == 1.0
    empty = jax.jit(lambda s: s.summary())(PolicyLossMetrics.empty())
    assert float(empty["ratio_min"]) == 1.0 and float(empty["clipfrac"]) == 0.0
    assert float(empty["tis_weight_mean"]) == 1.0 and float(empty["rollout_logprob_gap_max"]) == 0.0
    # The empty statistics are the identity of merge.
    once = jax.jit(lambda a: PolicyLossMetrics.empty().merge(a))(stats(2.0))
    assert all(float(x) == 2.0 for x in once)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"clip_eps_low": 1.0}, "clip_eps_low"),
        ({"clip_eps_high": -0.1}, "clip_eps_high"),
        ({"dual_clip_c": 1.0}, "dual_clip_c"),
        ({"kl_estimator": "k4"}, "kl_estimator.*k3"),
        ({"aggregation": "mean"}, "aggregation.*token_mean"),
        ({"aggregation": "fixed_denominator"}, "fixed_denominator > 0"),
        ({"tis_cap": 0.5}, "tis_cap must be 0 .off. or >= 1, got 0.5"),
        ({"tis_cap": -1.0}, "tis_cap"),
        ({"tis_cap": float("nan")}, "tis_cap"),
    ],
)
def test_policy_loss_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossConfig(**kwargs)


def test_policy_loss_rejects_bad_shapes_and_missing_inputs():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="logp must be"):
        policy_loss(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), jnp.zeros(3))
    with pytest.raises(ValueError, match="old_logp has shape"):
        policy_loss(x, jnp.zeros((2, 4)), jnp.zeros(2), x)
    with pytest.raises(ValueError, match="advantages has shape"):
        policy_loss(x, x, jnp.zeros(3), x, PG_ONLY["token_mean"])
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(x, x, jnp.zeros(2), x, PolicyLossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss(x, x, jnp.zeros(2), x, PolicyLossConfig(kl_coef=0.0, entropy_coef=0.1))
    with pytest.raises(ValueError, match="tis_cap > 0 or the decoupled surrogate needs rollout_logp"):
        policy_loss(x, x, jnp.zeros(2), x, PolicyLossConfig(kl_coef=0.0, tis_cap=2.0))
    with pytest.raises(ValueError, match="rollout_logp has shape"):
        policy_loss(x, x, jnp.zeros(2), x, PolicyLossConfig(kl_coef=0.0), rollout_logp=jnp.zeros((3, 2)))


def reference_behaviour_weight(proximal_logp, behaviour_logp, cap):
    """(weight, dropped) of the decoupled objective, in float64: tokens past the cap weigh 0."""
    raw = np.exp(np.asarray(proximal_logp, np.float64) - np.asarray(behaviour_logp, np.float64))
    dropped = raw > cap if cap > 0 else np.zeros(raw.shape, bool)
    return np.where(dropped, 0.0, raw), dropped


@PROPERTY
@given(**LOSS_INPUTS, behaviour_delta=DELTA, cap=st.sampled_from((0.0, 2.0)))
def test_decoupled_loss_matches_reference(logp, delta, behaviour_delta, ref_delta, entropy, adv, mask, mode, cap):
    """Clipped against the proximal policy, weighted by proximal / behaviour, tokens past the cap
    left out of the policy-gradient term but kept in the denominator."""
    config = DECOUPLED[mode, cap]
    proximal, ref_logp = logp - delta, logp + ref_delta
    behaviour = proximal - behaviour_delta
    (loss, out), grad = jitted_loss_grad_aux(config)(logp, proximal, adv, mask, ref_logp, behaviour, entropy)
    weight, dropped = reference_behaviour_weight(proximal, behaviour, cap)
    per_token, *_ = reference_per_token(logp, proximal, adv, ref_logp, entropy, config, tis_weight=weight)
    np.testing.assert_allclose(loss, reference_aggregate(per_token, mask, config), rtol=2e-5, atol=2e-5)
    on = mask > 0
    raw = np.exp(proximal.astype(np.float64) - behaviour)
    unsure = np.sum(on & np.isclose(raw, cap, rtol=1e-5, atol=0)) if cap else 0
    n = max(on.sum(), 1)
    metrics = out.metrics.summary()
    np.testing.assert_allclose(metrics["tis_capped_frac"], np.sum(on & dropped) / n, atol=unsure / n + 1e-7)
    # A dropped token gets no policy gradient: without KL and entropy, no gradient at all; the
    # kept ones get the reference's d(w * surrogate) / d logp.
    pg_only = dataclasses.replace(config, kl_coef=0.0, entropy_coef=0.0)
    (_, _), pg_grad = jitted_loss_grad_aux(pg_only)(logp, proximal, adv, mask, ref_logp, behaviour, entropy)
    far = on & dropped & ~np.isclose(raw, cap, rtol=1e-4, atol=0)
    assert np.all(np.asarray(pg_grad)[far] == 0)
    assert np.all(np.asarray(pg_grad)[~on] == 0) and np.all(np.isfinite(np.asarray(grad)))
    # With the behaviour equal to the proximal policy, the decoupled loss is plain PPO.
    ppo = dataclasses.replace(config, surrogate="ppo", tis_cap=0.0)
    same, _ = jitted_loss(config)(logp, proximal, adv, mask, ref_logp, proximal, entropy)
    plain, _ = jitted_loss(ppo)(logp, proximal, adv, mask, ref_logp, proximal, entropy)
    np.testing.assert_allclose(same, plain, rtol=1e-6, atol=1e-7)


@functools.cache
def jitted_loss_grad_aux(config):
    def value(logp, *rest):
        loss, out = loss_and_metrics(logp, *rest, config=config)
        return loss, (loss, out)

    grad = jax.jit(jax.grad(value, has_aux=True))

    def run(*args):
        g, aux = grad(*args)
        return aux, g

    return run


def test_decoupled_surrogate_needs_behaviour_logprobs_and_a_known_name():
    config = dataclasses.replace(CONFIGS["token_mean"], surrogate="decoupled")
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="decoupled surrogate needs rollout_logp"):
        policy_loss(x, x, jnp.ones(1), jnp.ones((1, 2)), config, ref_logp=x, entropy=x)
    with pytest.raises(ValueError, match="surrogate 'nope' is unknown"):
        PolicyLossConfig(surrogate="nope")
    weight, dropped = jax.jit(behaviour_importance_weight, static_argnames="cap")(
        jnp.zeros(3), jnp.array([-1000.0, -1.0, 0.0]), cap=2.0
    )
    assert weight.tolist() == [0.0, 0.0, 1.0] and dropped.tolist() == [True, True, False]
