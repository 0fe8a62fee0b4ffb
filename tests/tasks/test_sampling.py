"""Samplers: weights, Frontier's gamma share and top-3B pool, DTAC's replay cap and rho_inf
share, determinism under a key, and state round-trips through save and restore."""

import jax
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cua_jax.tasks.calibration import CalibrationConfig
from cua_jax.tasks.dynamic_sampling import DynamicSamplingConfig, collect_informative_groups
from cua_jax.tasks.pool import GroupOutcome, PoolTask, TaskPool, load_state, save_state
from cua_jax.tasks.samplers import (
    CurriculumConfig,
    CurriculumSampler,
    DTACConfig,
    DTACSampler,
    FrontierConfig,
    FrontierSampler,
    build_sampler,
)
from cua_jax.tasks.selection import (
    curriculum_competence,
    curriculum_select,
    dtac_select,
    frontier_select,
    frontier_weights,
    share_count,
    vas_weights,
    weighted_draw_scores,
)
from cua_jax.tasks.simulator import SimulatorConfig, TaskPoolSimulator

N = 64  # pool size of the property tests: fixed, so the jitted selectors compile once
GAP = 1e4

unit32 = st.floats(0.0, 1.0, allow_nan=False, width=32)


# -- numpy references ------------------------------------------------------------------


def frontier_weights_ref(p, mu, sigma):
    return np.exp(-((np.float64(p) - mu) ** 2) / (2 * sigma**2))


def vas_weights_ref(p):
    return 4 * np.float64(p) * (1 - np.float64(p))


def draw_scores_ref(gumbel, weights, eligible):
    positive = weights > 0
    scores = np.where(
        positive,
        np.log(np.where(positive, weights, np.float32(1))) + gumbel,
        gumbel - np.float32(GAP),
    )
    return np.where(eligible, scores, -np.inf).astype(np.float32)


def descending(scores):
    return np.argsort(-scores, kind="stable")


def frontier_select_ref(g_frontier, g_explore, weights, eligible, n_frontier, n_explore, pool_size):
    in_pool = np.zeros(weights.shape[0], bool)
    in_pool[descending(np.where(eligible, weights, -np.inf))[:pool_size]] = True
    in_pool &= eligible
    frontier = descending(draw_scores_ref(g_frontier, weights, in_pool))[:n_frontier]
    chosen = np.zeros_like(in_pool)
    chosen[frontier] = True
    explore_scores = np.where(eligible & ~chosen, g_explore - np.float32(GAP) * in_pool, -np.inf).astype(np.float32)
    explore = descending(explore_scores)[:n_explore]
    return np.concatenate([frontier, explore]), in_pool


def dtac_select_ref(g_vas, g_inf, weights, eligible, feasible, n_vas, n_inf):
    vas = descending(draw_scores_ref(g_vas, weights, eligible & feasible))[:n_vas]
    infeasible = descending(np.where(eligible & ~feasible, g_inf, -np.inf).astype(np.float32))[:n_inf]
    return np.concatenate([vas, infeasible])


def gumbels(seed, count):
    rng = np.random.default_rng(seed)
    return [rng.gumbel(size=N).astype(np.float32) for _ in range(count)]


# -- weights match the formulas ------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    p=st.lists(unit32, min_size=N, max_size=N),
    mu=st.floats(0.0, 1.0),
    sigma=st.floats(0.05, 1.0),
)
def test_weights_match_formulas(p, mu, sigma):
    p = np.array(p, np.float32)
    np.testing.assert_allclose(
        jax.jit(frontier_weights)(p, mu, sigma),
        frontier_weights_ref(p, mu, sigma),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(jax.jit(vas_weights)(p), vas_weights_ref(p), rtol=1e-5, atol=1e-6)


def test_weights_at_their_landmarks():
    assert float(frontier_weights(0.5, 0.5, 0.25)) == 1.0
    assert float(frontier_weights(0.75, 0.5, 0.25)) == pytest.approx(np.exp(-0.5))  # one sigma
    np.testing.assert_allclose(vas_weights(np.array([0.0, 0.5, 1.0, 0.25])), [0.0, 1.0, 0.0, 0.75])


def test_gumbel_top_k_draws_in_proportion_to_weight():
    """The first draw of weighted_draw_scores picks task i with probability w_i / sum(w)."""
    weights = np.array([0.05, 0.1, 0.2, 0.3, 0.35, 0.0], np.float32)
    keys = jax.random.split(jax.random.key(0), 20000)

    def first_pick(key):
        g = jax.random.gumbel(key, weights.shape)
        return jax.numpy.argmax(weighted_draw_scores(g, weights, np.ones(6, bool)))

    picks = np.asarray(jax.jit(jax.vmap(first_pick))(keys))
    frequency = np.bincount(picks, minlength=6) / picks.shape[0]
    np.testing.assert_allclose(frequency, weights / weights.sum(), atol=0.015)


# -- Frontier: gamma share and top-3B pool ------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    p=st.lists(unit32, min_size=N, max_size=N),
    eligible=st.lists(st.booleans(), min_size=N, max_size=N),
    batch_size=st.integers(1, 20),
    gamma=st.sampled_from([0.0, 0.1, 0.2, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_frontier_select_gamma_share_and_pool(p, eligible, batch_size, gamma, seed):
    eligible = np.array(eligible)
    if eligible.sum() < batch_size:
        eligible[:batch_size] = True
    weights = np.asarray(frontier_weights(np.array(p, np.float32), 0.5, 0.25))
    n_explore = share_count(batch_size, gamma)
    n_frontier = batch_size - n_explore
    pool_size = 3 * batch_size
    g_frontier, g_explore = gumbels(seed, 2)

    order, in_pool = jax.jit(frontier_select)(
        g_frontier, g_explore, weights, eligible, n_frontier, n_explore, pool_size
    )
    batch, in_pool = np.asarray(order)[:batch_size], np.asarray(in_pool)
    want, want_pool = frontier_select_ref(g_frontier, g_explore, weights, eligible, n_frontier, n_explore, pool_size)
    np.testing.assert_array_equal(batch, want)
    np.testing.assert_array_equal(in_pool, want_pool)

    # The invariants themselves, independent of the reference's mechanics.
    assert len(set(batch.tolist())) == batch_size and eligible[batch].all()
    assert in_pool.sum() == min(pool_size, eligible.sum())
    kth_weight = np.sort(weights[eligible])[::-1][min(pool_size, eligible.sum()) - 1]
    assert (weights[in_pool] >= kth_weight).all()  # the pool is the top-3B by weight
    assert in_pool[batch[:n_frontier]].all()  # (1 - gamma) B from the pool
    outside = (eligible & ~in_pool).sum()
    assert (~in_pool[batch[n_frontier:]]).sum() == min(n_explore, outside)  # gamma B from the rest


def test_frontier_sampler_batches_hold_the_shares():
    pool = TaskPool([PoolTask(f"t{i}", "d", 0, True, {"kind": "test"}) for i in range(200)])
    pool.pass_rate[:] = np.linspace(0, 1, 200, dtype=np.float32)
    sampler = FrontierSampler(pool, FrontierConfig(gamma=0.2))
    weights = sampler.weights()
    top = set(np.argsort(-weights, kind="stable")[:96].tolist())  # 3B for B = 32
    for seed in range(5):
        batch = pool.indices_of(sampler.sample(jax.random.key(seed), 32))
        in_top = sum(int(i) in top for i in batch)
        assert in_top == 32 - share_count(32, 0.2) == 26


# -- DTAC: rho_inf share and replay cap -----------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    p=st.lists(unit32, min_size=N, max_size=N),
    infeasible=st.sets(st.integers(0, N - 1), min_size=8, max_size=24),
    excluded=st.sets(st.integers(0, N - 1), max_size=8),
    batch_size=st.integers(1, 24),
    rho_inf=st.sampled_from([0.0, 0.05, 0.1, 0.25]),
    seed=st.integers(0, 2**16),
)
def test_dtac_select_rho_inf_share(p, infeasible, excluded, batch_size, rho_inf, seed):
    feasible = np.ones(N, bool)
    feasible[list(infeasible)] = False
    eligible = np.ones(N, bool)
    eligible[list(excluded)] = False
    n_inf = share_count(batch_size, rho_inf)
    n_vas = batch_size - n_inf
    if (eligible & ~feasible).sum() < n_inf or (eligible & feasible).sum() < n_vas:
        return
    weights = np.asarray(vas_weights(np.array(p, np.float32)))
    g_vas, g_inf = gumbels(seed, 2)
    batch = np.asarray(jax.jit(dtac_select)(g_vas, g_inf, weights, eligible, feasible, n_vas, n_inf))[:batch_size]
    np.testing.assert_array_equal(batch, dtac_select_ref(g_vas, g_inf, weights, eligible, feasible, n_vas, n_inf))
    assert len(set(batch.tolist())) == batch_size and eligible[batch].all()
    assert (~feasible[batch]).sum() == n_inf  # exactly the rho_inf share is infeasible


def test_dtac_sampler_rho_inf_share_per_batch():
    tasks = [PoolTask(f"t{i}", "d", 0, i % 4 != 0, {"kind": "test"}) for i in range(100)]
    pool = TaskPool(tasks)
    sampler = DTACSampler(pool, DTACConfig(rho_inf=0.1))
    for seed, batch_size in enumerate((8, 10, 16, 32, 40)):
        batch = pool.indices_of(sampler.sample(jax.random.key(seed), batch_size))
        assert (~pool.feasible[batch]).sum() == share_count(batch_size, 0.1)


@settings(max_examples=40, deadline=None)
@given(cap=st.integers(1, 4), num_cached=st.integers(1, 4), groups=st.integers(1, 20))
def test_dtac_replay_cap(cap, num_cached, groups):
    pool = TaskPool(
        [
            PoolTask("hard", "d", 2, True, {"kind": "test"}),
            PoolTask("easy", "d", 0, True, {"kind": "test"}),
        ]
    )
    sampler = DTACSampler(
        pool,
        DTACConfig(p_low=0.05, p_high=0.5, max_replays_per_trajectory=cap, replay_cache_size=4),
    )
    # "hard" gets its successes cached (p <= p_high); "easy" has p = 7/8, out of the band.
    sampler.update(
        [GroupOutcome("hard", 1, 8, f"hard-{k}") for k in range(num_cached)] + [GroupOutcome("easy", 7, 8, "easy-0")]
    )
    assert pool.pass_rate[0] == pytest.approx(1 / 8)

    replayed = []
    for _ in range(groups):
        outcomes = [
            GroupOutcome("hard", 0, 8),
            GroupOutcome("hard", 2, 8, "hard-new"),  # has a success of its own: no replay
            GroupOutcome("easy", 0, 8),  # out of the band: no replay
        ]
        replays = sampler.assign_replays(outcomes)
        assert all(r.group_index == 0 and r.task_id == "hard" for r in replays)
        replayed += [r.trajectory for r in replays]
    counts = {t: replayed.count(t) for t in set(replayed)}
    assert all(c <= cap for c in counts.values())
    assert len(replayed) == min(groups, cap * num_cached)


def adapr_reference(steps, num_tasks, p_low, p_high, cap, capacity, alpha):
    """DTAC's positive replay (AdaPR) written out in numpy from its rule, step by step: replays
    are assigned before the step's statistics move; an all-fail group (>= 2 attempts) of a task
    whose pass rate lies in [p_low, p_high] takes the cached success replayed least often (ties:
    the oldest), which leaves the cache at `cap` replays; then every group with a success of its
    own caches it when its task's rate (before this step) is unknown or <= p_high, keeping the
    newest `capacity`; then the pooled EMA of the step's rates. Returns the replayed names per step."""
    # float32, as the pool keeps its rates: a rate at a band's edge compares as the sampler's does.
    rate = np.full(num_tasks, np.nan, np.float32)
    cache = [[] for _ in range(num_tasks)]  # [name, replays] oldest first
    replayed = []
    for outcomes in steps:
        picks = []
        for g, (task, successes, attempts, _name) in enumerate(outcomes):
            if successes or attempts < 2 or not (p_low <= rate[task] <= p_high) or not cache[task]:
                continue
            k = min(range(len(cache[task])), key=lambda j: (cache[task][j][1], j))
            cache[task][k][1] += 1
            picks.append((g, cache[task][k][0]))
            if cache[task][k][1] >= cap:
                del cache[task][k]
        replayed.append(picks)
        for task, successes, _attempts, name in outcomes:
            if successes and (np.isnan(rate[task]) or rate[task] <= p_high):
                cache[task].append([name, 0])
                del cache[task][: max(0, len(cache[task]) - capacity)]
        for task in range(num_tasks):
            mine = [(s, a) for t, s, a, _ in outcomes if t == task]
            attempts = sum(a for _, a in mine)
            if attempts:
                observed = sum(s for s, _ in mine) / attempts
                rate[task] = (
                    observed if np.isnan(rate[task]) else np.float32((1 - alpha) * rate[task] + alpha * observed)
                )
    return replayed


outcome_st = st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(0, 4)).map(
    lambda t: (t[0], min(t[1], t[2]), t[2])
)


@settings(max_examples=60, deadline=None)
# A rate that lands on p_high exactly in float32 (1/3 then 2/9 at alpha 0.3: 0.3).
@example(steps=[[(1, 1, 3)], [(1, 0, 1), (1, 0, 4), (1, 2, 4)], [(1, 0, 2)]], p_low=0.0, p_high=0.3, cap=1, capacity=1)
@given(
    steps=st.lists(st.lists(outcome_st, min_size=1, max_size=4), min_size=1, max_size=12),
    p_low=st.sampled_from([0.0, 0.1]),
    p_high=st.sampled_from([0.3, 0.5, 1.0]),
    cap=st.integers(1, 3),
    capacity=st.integers(1, 3),
)
def test_dtac_replays_follow_the_adapr_reference(steps, p_low, p_high, cap, capacity):
    named = [[(t, s, a, f"s{i}g{g}") for g, (t, s, a) in enumerate(step)] for i, step in enumerate(steps)]
    pool = TaskPool([PoolTask(f"t{i}", "d", 0, True, {"kind": "test"}) for i in range(3)])
    sampler = DTACSampler(
        pool,
        DTACConfig(
            p_low=p_low, p_high=p_high, max_replays_per_trajectory=cap, replay_cache_size=capacity, ema_alpha=0.3
        ),
    )
    got = []
    for step in named:
        outcomes = [GroupOutcome(f"t{t}", s, a, name if s else None) for t, s, a, name in step]
        got.append([(r.group_index, r.trajectory) for r in sampler.assign_replays(outcomes)])
        sampler.update(outcomes)
    assert got == adapr_reference(named, 3, p_low, p_high, cap, capacity, alpha=0.3)


# -- the fixed curriculum (ScaleCUA Fig. 6a's baseline) --------------------------------------


def curriculum_competence_ref(step, start, steps, schedule):
    t = np.clip(step / steps, 0.0, 1.0)
    c = start + (1 - start) * t if schedule == "linear" else np.sqrt(t * (1 - start**2) + start**2)
    return min(1.0, float(c))


def curriculum_open_ref(difficulty, eligible, window):
    order = sorted(np.flatnonzero(eligible), key=lambda i: (difficulty[i], i))
    return set(order[:window])


@settings(max_examples=60, deadline=None)
@given(
    step=st.integers(-2, 300),
    start=st.floats(0.01, 1.0),
    steps=st.integers(1, 200),
    schedule=st.sampled_from(["linear", "sqrt"]),
)
def test_curriculum_competence_matches_reference_and_grows(step, start, steps, schedule):
    c = curriculum_competence(step, start, steps, schedule)
    assert c == pytest.approx(curriculum_competence_ref(step, start, steps, schedule), abs=1e-12)
    assert start - 1e-12 <= c <= 1.0 and curriculum_competence(step + 1, start, steps, schedule) >= c
    assert curriculum_competence(steps, start, steps, schedule) == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(
    difficulty=st.lists(st.integers(0, 4), min_size=N, max_size=N),
    eligible=st.lists(st.booleans(), min_size=N, max_size=N),
    window=st.integers(1, N),
    seed=st.integers(0, 2**16),
)
def test_curriculum_select_draws_only_the_easiest_window(difficulty, eligible, window, seed):
    difficulty, eligible = np.asarray(difficulty, np.float32), np.asarray(eligible)
    (gumbel,) = gumbels(seed, 1)
    order = np.asarray(jax.jit(curriculum_select)(gumbel, difficulty, eligible, np.int32(window)))
    assert sorted(order.tolist()) == list(range(N))
    open_set = curriculum_open_ref(difficulty, eligible, window)
    k = len(open_set)
    assert set(order[:k].tolist()) == open_set
    # Within the open set the order is the noise's: uniform draws.
    assert order[:k].tolist() == sorted(open_set, key=lambda i: (-gumbel[i], i))


def test_curriculum_sampler_opens_the_pool_easiest_first_on_its_schedule():
    pool = TaskPool(
        [PoolTask(f"t{i}", "d", tier, True, {"kind": "test"}) for i, tier in enumerate([2, 0, 1, 0, 2, 1, 0, 2])]
    )
    sampler = CurriculumSampler(pool, CurriculumConfig(difficulty="tier", start=0.25, steps=4, schedule="linear"))
    seen = []
    for step in range(6):
        share = sampler.open_share()
        drawn = sampler.sample(jax.random.key(step), 2)
        window = max(2, int(np.ceil(share * 8 - 1e-9)))
        assert set(pool.indices_of(drawn)) <= curriculum_open_ref(pool.tiers, np.ones(8, bool), window)
        seen.append(share)
    assert seen == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0])
    # Drawn from the tier-0 tasks (t1, t3, t6) first: 2 of the 8 open.
    assert set(CurriculumSampler(pool, sampler.config).sample(jax.random.key(0), 2)) <= {"t1", "t3", "t6"}


# -- determinism and state round-trips -----------------------------------------------------

SIM_CONFIG = SimulatorConfig(
    num_domains=3, train_tasks_per_domain=40, held_out_tasks_per_domain=5, infeasible_fraction=0.15
)
BATCH, GROUP = 8, 8


def build(kind: str, seed: int):
    sim = TaskPoolSimulator(SIM_CONFIG, seed=seed)
    pool = TaskPool(sim.pool_tasks())
    calibration = {
        "uniform": None,
        "frontier": CalibrationConfig(pilot=True, keep_infeasible=False),
        "dtac": CalibrationConfig(pilot=True, every_k_steps=2, sample_size=30, group_size=4, min_active=40),
        # The pilot's rates order the fixed curriculum.
        "curriculum": CalibrationConfig(pilot=True, keep_infeasible=False),
    }[kind]
    dtac = DTACConfig(rho_inf=0.25, p_high=0.6)
    curriculum = CurriculumConfig(difficulty="pass_rate", start=0.3, steps=5)
    return sim, build_sampler(
        kind, pool, dtac=dtac, curriculum=curriculum, calibration=calibration, run_groups=sim.run_groups
    )


def train_step(kind, sim, sampler, key):
    """One step; DTAC runs under DAPO dynamic sampling. Returns the task ids run."""
    if kind == "dtac":
        batch = collect_informative_groups(key, sampler, sim.run_groups, BATCH, GROUP)
        assert all(
            0 < o.successes + any(r.group_index == g for r in batch.replays) < o.attempts
            for g, o in enumerate(batch.groups)
        )  # only informative groups are kept
        replayed = np.zeros(len(batch.groups), bool)
        replayed[[r.group_index for r in batch.replays]] = True
        sim.learn(batch.groups, replayed)
        return sorted(o.task_id for o in batch.groups + batch.dropped)
    task_ids = sampler.sample(key, BATCH)
    outcomes = sim.run_groups(task_ids, GROUP)
    replays = sampler.assign_replays(outcomes)
    assert not replays
    sim.learn(outcomes)
    sampler.update(outcomes)
    return task_ids


def run(kind, seed, keys, sim=None, sampler=None):
    if sim is None:
        sim, sampler = build(kind, seed)
    return [train_step(kind, sim, sampler, k) for k in keys], sim, sampler


def step_keys(seed, steps):
    base = jax.random.key(seed)
    return [jax.random.fold_in(base, t) for t in range(steps)]


@pytest.mark.parametrize("kind", ["uniform", "frontier", "dtac", "curriculum"])
def test_sampling_is_deterministic_under_a_seed(kind):
    first, _, _ = run(kind, 0, step_keys(0, 4))
    again, _, sampler = run(kind, 0, step_keys(0, 4))
    other, _, _ = run(kind, 0, step_keys(1, 4))
    assert first == again
    assert first != other
    if kind == "dtac":  # the pilot and the calibrations at steps 2 (4 is not reached) ran
        assert [(r.step, r.pilot) for r in sampler.reports] == [(0, True), (2, False)]


@pytest.mark.parametrize("kind", ["uniform", "frontier", "dtac", "curriculum"])
def test_state_round_trips_through_save_and_restore(kind, tmp_path):
    keys = step_keys(3, 6)
    uninterrupted, sim_a, sampler_a = run(kind, 3, keys)

    head, sim, sampler = run(kind, 3, keys[:3])
    save_state(tmp_path / "tasks.pkl", {"sampler": sampler.state_dict(), "simulator": sim.state_dict()})
    del sim, sampler
    restored = load_state(tmp_path / "tasks.pkl")
    sim_b, sampler_b = build(kind, 3)
    sampler_b.load_state_dict(restored["sampler"])
    sim_b.load_state_dict(restored["simulator"])
    tail, _, _ = run(kind, 3, keys[3:], sim_b, sampler_b)

    assert head + tail == uninterrupted
    state_a, state_b = sampler_a.pool.state_dict(), sampler_b.pool.state_dict()
    for name in ("attempts", "successes", "pass_rate", "last_step_sampled", "active"):
        np.testing.assert_array_equal(state_a[name], state_b[name])
    assert state_a["replay_cache"] == state_b["replay_cache"]
    assert sampler_a.step == sampler_b.step == 6


def test_restore_refuses_a_different_task_set():
    _, sampler = build("uniform", 0)
    other = TaskPool([PoolTask("x", "d", 0, True, {"kind": "test"})])
    with pytest.raises(ValueError, match="does not match this pool's tasks"):
        other.load_state_dict(sampler.pool.state_dict())


def test_each_sampler_reports_what_its_draws_rest_on():
    """sampler.metrics(): the pool's estimates, and each kind's own quantities."""
    tasks = [PoolTask(f"t{i}", "d", i % 2, True, {"kind": "test"}) for i in range(4)]
    outcomes = [
        GroupOutcome("t0", 1, 4, "t0-win"),
        GroupOutcome("t1", 3, 4, "t1-win"),
        GroupOutcome("t2", 2, 4, "t2-win"),
    ]
    for kind in ("uniform", "frontier", "dtac", "curriculum"):
        sampler = build_sampler(kind, TaskPool(tasks))
        sampler.update(outcomes)
        metrics = sampler.metrics()
        assert metrics["sampler/active_tasks"] == 4 and metrics["sampler/estimated_tasks"] == 3
        assert metrics["sampler/pass_rate_mean"] == pytest.approx((0.25 + 0.75 + 0.5) / 3)
        if kind == "frontier":
            p = np.asarray([0.25, 0.75, 0.5, 0.5])  # t3 unknown: unknown_pass_rate 0.5
            assert metrics["sampler/frontier_weight_max"] == pytest.approx(1.0)
            assert metrics["sampler/frontier_weight_mean"] == pytest.approx(
                frontier_weights_ref(p, 0.5, 0.25).mean(), rel=1e-5
            )
        if kind == "dtac":  # band [0.05, 0.5]: t0 (0.25) and t2 (0.5); successes cached where p was unknown
            assert metrics["sampler/replay_band_tasks"] == 2 and metrics["sampler/replay_cache"] == 3
            assert (
                metrics["sampler/tier_0/pass_rate"] == pytest.approx(0.375)
                and metrics["sampler/tier_1/pass_rate"] == 0.75
            )
        if kind == "curriculum":
            assert metrics["sampler/open_share"] == pytest.approx(0.25)


def test_dapo_rounds_draw_a_small_pool_again_only_with_repeat_tasks():
    """Three tasks, a batch of three: the first round draws all of them, so without
    repeat_tasks a short batch ends the step; with it, later rounds draw the tasks again (new
    groups) until the batch is full or the rounds run out, and every group run is recorded."""
    tasks = [PoolTask(f"t{i}", "d", 0, True, {"kind": "test"}) for i in range(3)]
    calls: list[list[str]] = []

    def run_groups(task_ids, group_size):
        # t0 always informative; t1 informative on its second group; t2 never.
        calls.append(list(task_ids))
        seen = [t for call in calls for t in call]
        outcomes = []
        for task in task_ids:
            informative = task == "t0" or (task == "t1" and seen.count("t1") >= 2)
            outcomes.append(GroupOutcome(task, 1 if informative else 0, group_size))
        return outcomes

    short = collect_informative_groups(
        jax.random.key(0), build_sampler("uniform", TaskPool(tasks)), run_groups, 3, 4, DynamicSamplingConfig()
    )
    assert short.rounds == 1 and short.missing == 2 and [o.task_id for o in short.groups] == ["t0"]

    calls.clear()
    sampler = build_sampler("uniform", TaskPool(tasks))
    config = DynamicSamplingConfig(max_rounds=4, repeat_tasks=True)
    batch = collect_informative_groups(jax.random.key(0), sampler, run_groups, 3, 4, config)
    assert sorted(calls[0]) == ["t0", "t1", "t2"] and len(calls[1]) == 2
    assert all(len(set(call)) == len(call) for call in calls)  # a round's tasks are distinct
    assert len(batch.groups) + batch.missing == 3 and batch.rounds == len(calls)
    assert all(0 < o.successes < o.attempts for o in batch.groups)
    assert batch.rollouts == 4 * sum(map(len, calls)) == 4 * (len(batch.groups) + len(batch.dropped))
    drawn = [t for call in calls for t in call]
    assert list(sampler.pool.attempts) == [4 * drawn.count(t) for t in ("t0", "t1", "t2")]
    assert sampler.step == 1
