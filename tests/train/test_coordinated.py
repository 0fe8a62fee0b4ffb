"""Coordinated collection's pieces in one process (cua_jax/train/coordinated.py): the partition
of a draw's groups, the exchange's sums, group summaries, the agreed batch shape, and the loss
of a global batch assembled from processes' rows, which must equal one process's loss on the
same items (the two-process run itself: tests/launch/test_multihost_coordinated.py)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import threading

import numpy as np
import pytest

from cua_jax.train.batching import BatchingConfig, group_order, make_minibatches
from cua_jax.train.coordinated import (
    BatchShape,
    MicrobatchShape,
    ProcessGroup,
    agree_batch_shape,
    check_same_state,
    group_summary,
    items_of_whole_batch,
    minibatch_shares,
    partition_groups,
    process_microbatches,
    step_share,
)
from cua_jax.train.settings import ConfigError, TrainSettings
from cua_jax.types import Episode, EpisodeStatus, ImageSpan, TrainingItem, Turn
from tests.support.models import SMALL_QWEN3
from tests.support.trainer import tiny_config


def thread_processes(count: int) -> list[ProcessGroup]:
    """`count` ProcessGroups whose exchange meets across threads (one thread per process)."""
    barrier, slots = threading.Barrier(count), [None] * count

    def member(p: int) -> ProcessGroup:
        def exchange(value):
            slots[p] = value
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

        return ProcessGroup(p, count, exchange)

    return [member(p) for p in range(count)]


def on_threads(processes: list[ProcessGroup], fn) -> list:
    """fn(process) on a thread per process; the results by process index."""
    with concurrent.futures.ThreadPoolExecutor(len(processes)) as pool:
        return list(pool.map(fn, processes, timeout=60))


def test_partition_deals_equal_groups_round_robin():
    assert partition_groups([16.0] * 5, 2) == [0, 1, 0, 1, 0]
    assert partition_groups([16.0] * 4, 4) == [0, 1, 2, 3]
    assert partition_groups([1.0, 1.0], 3) == [0, 1]  # a process may get none
    assert partition_groups([], 2) == []
    assert partition_groups([3.0, 1.0], 1) == [0, 0]


def test_partition_balances_expected_cost_with_whole_groups():
    costs = [8.0, 1.0, 1.0, 1.0, 1.0, 4.0, 4.0]
    owners = partition_groups(costs, 2)
    assert owners == partition_groups(list(costs), 2)  # a pure function: every process agrees
    loads = [sum(c for c, o in zip(costs, owners) if o == p) for p in range(2)]
    assert loads == [10.0, 10.0]  # the most expensive first, each to the least loaded process
    assert owners[0] != owners[5] == owners[6] or owners[0] != owners[6]
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        partition_groups([1.0], 0)
    with pytest.raises(ValueError, match="costs must be >= 0"):
        partition_groups([-1.0], 2)


def test_all_reduce_sum_adds_every_process_values_in_process_order():
    processes = thread_processes(3)
    values = [{"a": 1.0, "b": 0.5}, {"a": 2.0}, {"c": 4.0, "a": 0.25}]
    sums = on_threads(processes, lambda p: p.all_reduce_sum(values[p.index]))
    assert sums == [{"a": 3.25, "b": 0.5, "c": 4.0}] * 3


class FakeWorker:
    """`run_groups` as a rollout worker answers it (no engine, no browser): n one-turn episodes
    per (task, seed, group id) request, whose replies encode (seed, k), the first
    `successes[task]` of them successes (of odd seeds only, for a task marked "odd")."""

    def __init__(self, successes: dict[str, int]):
        self.successes = successes
        self.requests: list[tuple] = []

    def run_groups(self, requests, n):
        from cua_jax.rollout.agent_loop import Rollout

        self.requests += list(requests)
        out = []
        for task, seed, group_id in requests:
            group = []
            for k in range(n):
                count = self.successes.get(task, 0)
                success = k < (count[0] if seed % 2 else 0) if isinstance(count, tuple) else k < count
                turn = Turn("", [], np.asarray([seed % 1000, k], np.int32), np.zeros(2, np.float32))
                status = EpisodeStatus.SUCCESS if success else EpisodeStatus.FAILURE
                episode = Episode(f"{task}/g{group_id}/e{k}", task, group_id, "do it", [turn], float(success))
                episode.status = status
                item = TrainingItem(
                    np.arange(4, dtype=np.int32),
                    np.asarray([0, 0, 1, 1], np.int32),
                    np.zeros(4, np.float32),
                    [],
                    episode.episode_id,
                    group_id,
                    (0,),
                )
                group.append(Rollout(episode, [item]))
            out.append(group)
        return out


@pytest.mark.parametrize(
    ("sampler", "calibrated", "dapo"),
    [("frontier", False, False), ("dtac", False, False), ("uniform", True, False), ("dtac", False, True)],
    ids=["frontier", "dtac", "calibration", "dtac_dapo"],
)
def test_coordinated_collection_draws_and_runs_the_groups_of_one_process(sampler, calibrated, dapo):
    """Two processes (threads here) collecting their shares of 6 steps with a sampler whose
    draws depend on every earlier outcome: the draws, seeds, group ids and episodes of one
    process collecting everything, each group run once, on its owner, and the samplers left in
    the same state. DTAC: the same replays, swapped into the owner's groups and the summaries.
    Calibration (a pilot pass, then every 2 steps): its passes split between the processes too.
    DAPO: every round split, the same groups kept, the same DAPO metrics."""
    import jax

    from cua_jax.train.collect import GroupCollector

    successes = {"click-button": (2,), "click-tab": 0, "click-widget": 4, "focus-text": (1,)}

    def collector(worker):
        config = tiny_config("/tmp/unused", sampler__kind=sampler, rollout__batch_tasks=3, rollout__group_size=4)
        config.sampler.dtac.p_high = 1.0
        config.train.dapo, config.train.dapo_max_rounds, config.train.dapo_repeat_tasks = dapo, 3, True
        if calibrated:
            c = config.sampler.calibration
            c.enabled, c.every_k_steps, c.sample_size, c.group_size, c.p_min, c.p_max = True, 2, 3, 2, 0.1, 1.0
            config.sampler.pilot.group_size = 2
        config.env.tasks = tuple((task, 0) for task in successes)
        settings = TrainSettings.from_config(config)
        pool = settings.catalog.pool(settings.domain_weights, settings.training_tasks)
        return GroupCollector(settings, jax.random.key(7), worker, pool)

    one = collector(FakeWorker(successes))
    steps = 6
    reference, reference_extra = zip(*(one.collect(step) for step in range(steps)))
    if sampler == "dtac":
        assert sum(g.replayed for groups in reference for g in groups) >= 2
    workers = [FakeWorker(successes), FakeWorker(successes)]
    collectors = [collector(worker) for worker in workers]
    results = on_threads(
        thread_processes(2), lambda p: [collectors[p.index].collect_share(s, None, p) for s in range(steps)]
    )

    def content(group):
        episodes = [(e.episode_id, e.status, e.reward, e.turns[0].response_ids.tolist()) for e in group.episodes]
        return episodes, sorted(group.items), group.replayed

    for step, expected in enumerate(reference):
        owners = partition_groups([16.0] * len(expected), 2)
        for p in range(2):
            local, summaries, extra = results[p][step]
            assert extra == reference_extra[step]
            assert [content(g) for g in summaries] == [content(g) for g in expected]
            if not dapo:  # DAPO keeps the informative groups of its rounds, each dealt in its round
                assert [g.group_id for g in local] == [g.group_id for g, o in zip(expected, owners) if o == p]
            for group in local:
                assert content(group) == content(next(g for g in expected if g.group_id == group.group_id))
    ran = [request for worker in workers for request in worker.requests]
    assert sorted(ran) == sorted(one.default_worker.requests)  # each group once, calibration's too
    assert all(worker.requests for worker in workers)
    assert (sum(r[2] < 0 for r in ran) > 0) == calibrated
    assert sum(r[2] >= 0 for r in ran) == one.next_group_id and (one.next_group_id > steps * 3) == dapo
    for step in range(steps):  # every kept group on exactly one process
        owned = sorted(g.group_id for p in range(2) for g in results[p][step][0])
        assert owned == sorted(g.group_id for g in reference[step])

    def plain(state):  # arrays as lists; DTAC's cached successes (Rollouts) field by field
        def default(value):
            if dataclasses.is_dataclass(value):
                return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return np.asarray(value).tolist()

        return json.loads(json.dumps(state, default=default))

    for c in collectors:
        assert plain(c.sampler.state_dict()) == plain(one.sampler.state_dict())
        assert c.sampler_metrics == one.sampler_metrics and c.next_group_id == one.next_group_id


def _item(rng, episode_id: str, group_id: int, n: int | None = None) -> TrainingItem:
    n = int(rng.integers(12, 40)) if n is None else n
    ids = rng.integers(3, SMALL_QWEN3["vocab_size"], n).astype(np.int32)
    mask = np.zeros(n, np.int32)
    mask[n // 2 :] = 1
    logp = np.where(mask > 0, rng.uniform(-5.5, -4.0, n), 0.0).astype(np.float32)
    return TrainingItem(ids, mask, logp, [], episode_id, group_id, (0,))


def _items(num_groups: int = 4, group_size: int = 2, seed: int = 1):
    rng = np.random.default_rng(seed)
    items, advantages = [], []
    for g in range(num_groups):
        group = rng.normal(size=group_size)
        group -= group.mean()
        for k in range(group_size):
            items.append(_item(rng, f"ep{g}-{k}", g))
            advantages.append(group[k])
    return items, np.asarray(advantages, np.float32)


def test_group_summary_drops_arrays_but_keeps_counts_and_metrics():
    from cua_jax.train.groups import CollectedGroup, prepare_batch

    rng = np.random.default_rng(0)
    groups = []
    for g in range(2):
        episodes, items = [], {}
        for k in range(2):
            turn = Turn("page", [np.ones((8, 8, 3), np.uint8)], np.arange(3, dtype=np.int32), np.zeros(3, np.float32))
            status = EpisodeStatus.SUCCESS if (g + k) % 2 else EpisodeStatus.FAILURE
            episode = Episode(
                f"t/g{g}/e{k}", "click-button", g, "do it", [turn], float(status is EpisodeStatus.SUCCESS)
            )
            episode.status = status
            episodes.append(episode)
            items[episode.episode_id] = [_item(rng, episode.episode_id, g), _item(rng, episode.episode_id, g)]
        groups.append(CollectedGroup(g, "click-button", episodes, items=items))
    summaries = [group_summary(g) for g in groups]
    assert all(not t.images for s in summaries for e in s.episodes for t in e.turns)
    assert all(len(i.ids) == 0 for s in summaries for items in s.items.values() for i in items)
    assert groups[0].episodes[0].turns[0].images  # the group itself is untouched
    settings = TrainSettings.from_config(tiny_config("/tmp/unused"))
    whole, summary = prepare_batch(groups, settings, 1, 0), prepare_batch(summaries, settings, 1, 0)
    assert summary.metrics == whole.metrics and summary.metrics["batch/items"] == 8.0
    np.testing.assert_array_equal(summary.item_advantages, whole.item_advantages)


def test_processes_take_their_items_of_the_whole_batch_mini_batches():
    """The mini-batch plan of every group's summary, each process taking its own groups' items
    of each: together the mini-batches one process cuts from all the items."""
    from cua_jax.train.buffer import whole_group_minibatches

    items, advantages = _items(num_groups=5)
    items += [_item(np.random.default_rng(9), "ep4-2", 4)]  # a larger last group
    advantages = np.append(advantages, 0.5).astype(np.float32)
    order = group_order(items)
    plan = whole_group_minibatches([len(g) for g in order], 2)
    minibatch_groups = [[items[order[g][0]].group_id for g in mb] for mb in plan]
    reference = [[items[i].episode_id for g in mb for i in order[g]] for mb in plan]
    owners = partition_groups([1.0] * 5, 2)  # groups 0, 2, 4 | 1, 3
    shares = []
    for p in range(2):
        mine = [k for k, item in enumerate(items) if owners[item.group_id] == p]
        shares.append(minibatch_shares([items[k] for k in mine], advantages[mine], minibatch_groups))
    for m, expected in enumerate(reference):
        got = [item.episode_id for p in range(2) for item in shares[p][m][0]]
        assert sorted(got) == sorted(expected)
        for p in range(2):
            for item, advantage in zip(*shares[p][m]):
                assert advantage == advantages[next(k for k, other in enumerate(items) if other is item)]


def test_permuted_rewards_take_the_whole_batch_advantages():
    """advantage.permute_rewards credits each episode with another's outcome across the whole
    batch: a process's items take the advantages of `prepare_batch` over every group's summary,
    which equal one process's over every group."""
    from cua_jax.train.groups import CollectedGroup, prepare_batch

    rng = np.random.default_rng(0)
    groups = []
    for g in range(4):
        episodes, items = [], {}
        for k in range(3):
            turn = Turn("page", [], np.arange(3, dtype=np.int32), np.zeros(3, np.float32))
            status = [EpisodeStatus.SUCCESS, EpisodeStatus.FAILURE, EpisodeStatus.NO_VERDICT][(g + k) % 3]
            episode = Episode(
                f"t/g{g}/e{k}", "click-button", g, "do it", [turn, turn], float(status is EpisodeStatus.SUCCESS)
            )
            episode.status = status
            episodes.append(episode)
            items[episode.episode_id] = [_item(rng, episode.episode_id, g) for _ in range(1 + (k == 1))]
        groups.append(CollectedGroup(g, "click-button", episodes, items=items))
    config = tiny_config("/tmp/unused", advantage__permute_rewards=True, advantage__item_advantages="stepo")
    settings = TrainSettings.from_config(config)
    one = prepare_batch(groups, settings, 1, 3)
    whole = prepare_batch([group_summary(g) for g in groups], settings, 1, 3)
    np.testing.assert_array_equal(whole.item_advantages, one.item_advantages)
    owners = partition_groups([1.0] * 4, 2)
    got = {}
    for p in range(2):
        local = prepare_batch([g for g in groups if owners[g.group_id] == p], settings, 1, 3)
        advantages = items_of_whole_batch(local.items, whole.items, whole.item_advantages)
        got.update({id(item): a for item, a in zip(local.items, advantages)})
    np.testing.assert_array_equal([got[id(item)] for item in one.items], one.item_advantages)
    assert np.abs(one.item_advantages).sum() > 0


def test_processes_agree_on_the_batch_shape():
    items, _ = _items(num_groups=3)
    config = BatchingConfig(rows=4, length_multiple=32)
    shares = [items[:4], items[4:]]  # 4 items and 2
    shapes = on_threads(thread_processes(2), lambda p: agree_batch_shape(shares[p.index], config, 1, p))
    lengths = [max(len(items[m]), len(items[4 + m])) for m in range(2)] + [len(items[2]), len(items[3])]
    expected = BatchShape(tuple(MicrobatchShape(-(-n // 32) * 32) for n in lengths), 6, sum(len(i) for i in items))
    assert shapes == [expected, expected]


def test_processes_agree_on_their_prefix_blocks():
    """With shared prefix rows: each process's block holds as many prefix rows as the process
    with the most groups needs (a multiple of its row shards), at the longest prefix's bucket."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 100, 40).astype(np.int32)

    def item(episode_id, group_id, extra):
        ids = np.concatenate([prompt[: 20 + 10 * group_id], rng.integers(3, 100, extra).astype(np.int32)])
        mask = np.zeros(len(ids), np.int32)
        mask[-extra:] = 1
        return TrainingItem(ids, mask, np.where(mask > 0, -4.0, 0.0).astype(np.float32), [], episode_id, group_id, (0,))

    shares = [[item("a", 0, 5), item("b", 0, 9), item("c", 1, 3), item("d", 1, 4)], [item("e", 2, 6), item("f", 2, 2)]]
    config = BatchingConfig(rows=8, length_multiple=32, share_prefix=True, suffix_length_multiple=8)
    shapes = on_threads(thread_processes(2), lambda p: agree_batch_shape(shares[p.index], config, 4, p, shards=2))
    # Rows hold what follows each group's prefix (the token before the first trained one on).
    # Splits 19, 29, 39 (the token before each group's first trained one); rows of 6, 10 | 4, 5 | 7, 3.
    tokens = (19 + 6 + 10) + (29 + 4 + 5) + (39 + 7 + 3)
    assert shapes[0] == shapes[1] == BatchShape((MicrobatchShape(16, (2, 64)),), 6, tokens)


@pytest.mark.parametrize("share_prefix", [False, True], ids=["rows", "shared_prefix"])
def test_the_global_batch_of_two_processes_has_the_loss_of_one_process(share_prefix):
    """Two processes' rows (3 groups on one, 1 on the other: the second pads with empty rows and
    a whole empty micro-batch) stacked as the global micro-batches: the loss, gradient norm and
    update equal one process's on all items in one micro-batch, because the token-mean
    denominator and the loss metrics are summed over the whole global batch. With shared
    prefix rows each process's prefix block follows the other's and its rows point into it."""
    import jax
    from flax import nnx

    from cua_jax.models.qwen3 import Qwen3ForCausalLM, tiny_qwen3_config
    from cua_jax.models.sharding import MeshConfig, make_mesh
    from cua_jax.rl.losses import PolicyLossConfig
    from cua_jax.train.learner import Learner, LearnerConfig, OptimizerConfig

    items, advantages = _items(num_groups=4)
    if share_prefix:  # a group's items share a prompt
        for k in range(0, len(items), 2):
            first, second = items[k], items[k + 1]
            n = min(len(first), len(second)) // 2
            second.ids[:n] = first.ids[:n]
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2), devices=jax.devices()[:8])
    config = LearnerConfig(
        optimizer=OptimizerConfig(learning_rate=1e-2, eps=1e-3, max_grad_norm=1.0),
        loss=PolicyLossConfig(aggregation="token_mean", kl_coef=1e-2, entropy_coef=1e-2),
    )

    def learner():
        model = Qwen3ForCausalLM(tiny_qwen3_config(**SMALL_QWEN3), rngs=nnx.Rngs(0))
        return Learner(model, config, mesh=mesh)

    batching = BatchingConfig(rows=8, length_multiple=32, share_prefix=share_prefix, suffix_length_multiple=16)
    reference = learner()
    [micro] = make_minibatches(items, advantages, batching, 1)
    assert len(micro) == 1
    expected = reference.update(micro)

    shares = [(items[:6], advantages[:6]), (items[6:], advantages[6:])]  # groups 0-2 | group 3
    assert reference.process_rows(batching.rows) == (8, 0, 4)  # one process: every row, in 4 shards
    with pytest.MonkeyPatch.context() as patch:  # as the second of two processes on this mesh
        patch.setattr(jax, "process_count", lambda: 2)
        with pytest.raises(ValueError, match=r"does not split micro-batches of 8 rows \(learner.rows\) into one "):
            reference.process_rows(batching.rows)
    rows = 4  # as if each of two processes held half the rows, in 2 shards
    shapes = on_threads(thread_processes(2), lambda p: agree_batch_shape(shares[p.index][0], batching, rows, p, 2))
    parts = [process_microbatches(*share, batching, rows, shapes[0], block=p) for p, share in enumerate(shares)]
    assert [len(part) for part in parts] == [2, 2]  # the second process's second micro-batch is empty
    assert not parts[1][1].item_valid.any()
    stacked = [
        jax.tree.map(lambda a, b: np.concatenate([a, b], axis=a.ndim - 2 if a.ndim == 3 else 0), first, second)
        for first, second in zip(*parts)
    ]
    coordinated = learner()
    got = coordinated.update([coordinated.global_batch(mb) for mb in stacked])
    for key in ("loss", "grad_norm", "entropy", "num_tokens", "loss_denominator", "ref_kl"):
        np.testing.assert_allclose(got[key], expected[key], rtol=2e-6, atol=1e-9, err_msg=key)  # ref_kl: ~0
    for a, b in zip(jax.tree.leaves(nnx.state(coordinated.model)), jax.tree.leaves(nnx.state(reference.model))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # What the exact reduction rules out: each process's own token mean, averaged.
    if not share_prefix:  # (alone, the second process's prefix indices would point past its block)
        per_process = [learner().update([learner().global_batch(mb) for mb in part])["loss"] for part in parts]
        assert abs(np.mean(per_process) - expected["loss"]) > 1e-4


def _screenshot_items(vl_config, num_groups: int = 4):
    """Groups of 2 items on a tiny Qwen3-VL: each item opens with its group's screenshot (the
    same patches in both: shared prefix rows hold it once) and a shared instruction, then shows
    a screenshot of its own before its response. (items, advantages, pixel_patches)."""
    rng = np.random.default_rng(3)
    grid = (1, 4, 4)  # 16 patches, 4 image tokens after the 2x2 merge
    image = [vl_config.vision_start_token_id] + [vl_config.image_token_id] * 4 + [vl_config.vision_end_token_id]
    patches = lambda: rng.normal(size=(16, vl_config.vision.patch_dim)).astype(np.float32)
    items, advantages, pixel_patches = [], [], {}
    for g in range(num_groups):
        shared = patches()
        prompt = [5, 6, *image, *rng.integers(10, 200, int(rng.integers(3, 9)))]
        for k in range(2):
            episode_id = f"ep{g}-{k}"
            second = len(prompt) + 1
            ids = [*prompt, 7, *image, *rng.integers(10, 200, int(rng.integers(6, 14)))]
            mask = np.zeros(len(ids), np.int32)
            mask[second + 6 :] = 1
            logp = np.where(mask > 0, rng.uniform(-5.5, -4.0, len(ids)), 0.0).astype(np.float32)
            spans = [ImageSpan(3, 7, 0, 0, grid), ImageSpan(second + 1, second + 5, 1, 0, grid)]
            items.append(TrainingItem(np.asarray(ids, np.int32), mask, logp, spans, episode_id, g, (0, 1)))
            pixel_patches[(episode_id, 0, 0)] = shared
            pixel_patches[(episode_id, 1, 0)] = patches()
            advantages.append(float(rng.normal()))
    return items, np.asarray(advantages, np.float32), pixel_patches


@pytest.mark.parametrize("share_prefix", [False, True], ids=["rows", "shared_prefix"])
def test_the_global_batch_of_two_processes_with_screenshots_has_the_loss_of_one_process(share_prefix):
    """As above with a vision-language policy on items with screenshots: each process's rows
    carry every process's images (one exchange per mini-batch; replicated over the mesh), in the
    global rows' placeholder order, so the vision tower encodes what one process collating all
    items encodes, and the loss, gradient norm and update equal one process's."""
    import jax
    from flax import nnx

    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
    from cua_jax.models.sharding import MeshConfig, make_mesh
    from cua_jax.rl.losses import PolicyLossConfig
    from cua_jax.train.batching import MultimodalPositions
    from cua_jax.train.learner import Learner, LearnerConfig, OptimizerConfig

    vl_config = tiny_qwen3_vl_config()
    vl_config = dataclasses.replace(  # one decoder layer, one vision block
        vl_config,
        text=dataclasses.replace(vl_config.text, num_hidden_layers=1),
        vision=dataclasses.replace(vl_config.vision, depth=1, deepstack_visual_indexes=(0,)),
    )
    multimodal = MultimodalPositions.of(vl_config)
    items, advantages, pixel_patches = _screenshot_items(vl_config)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=1), devices=jax.devices()[:4])
    config = LearnerConfig(
        optimizer=OptimizerConfig(learning_rate=1e-2, eps=1e-3, max_grad_norm=1.0),
        loss=PolicyLossConfig(aggregation="token_mean", kl_coef=1e-2, entropy_coef=1e-2),
    )

    def learner():
        return Learner(Qwen3VLForConditionalGeneration(vl_config, rngs=nnx.Rngs(0)), config, mesh=mesh)

    batching = BatchingConfig(rows=8, length_multiple=32, share_prefix=share_prefix, suffix_length_multiple=16)
    reference = learner()
    [micro] = make_minibatches(items, advantages, batching, 1, pixel_patches=pixel_patches, multimodal=multimodal)
    assert len(micro) == 1
    expected = reference.update(micro)

    shares = [(items[:6], advantages[:6]), (items[6:], advantages[6:])]  # groups 0-2 | group 3
    rows = 4  # as if each of two processes held half the rows, in 2 shards

    def process(p):
        mine, adv = shares[p.index]
        shape = agree_batch_shape(mine, batching, rows, p, 2, pixel_patches)
        return process_microbatches(
            mine, adv, batching, rows, shape, multimodal, p.index, pixel_patches=pixel_patches, processes=p
        )

    parts = on_threads(thread_processes(2), process)
    assert [len(part) for part in parts] == [2, 2]  # the second process's second micro-batch is empty
    images = ("pixel_values", "patch_offsets")
    stacked = []
    for first, second in zip(*parts):
        for name in images:  # every process holds the whole micro-batch's images
            np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
        assert first.image_grid == second.image_grid
        rows_of = lambda b: b.replace(pixel_values=None, patch_offsets=None)
        joined = jax.tree.map(
            lambda a, b: np.concatenate([a, b], axis=a.ndim - 2 if a.ndim == 3 else 0),
            rows_of(first),
            rows_of(second),
        )
        stacked.append(joined.replace(pixel_values=first.pixel_values, patch_offsets=first.patch_offsets))
        if share_prefix:
            np.testing.assert_array_equal(first.prefix.pixel_values, second.prefix.pixel_values)
            stacked[-1] = stacked[-1].replace(prefix=stacked[-1].prefix.replace(pixel_values=first.prefix.pixel_values))
    # Each group's screenshot: once in a prefix row with shared prefixes, else in both its rows.
    real = sum(len(item.images) for item in items) - (4 if share_prefix else 0)
    held = sum(len(b.image_grid.thw) for b in stacked if b.image_grid is not None)
    if share_prefix:
        held += sum(len(b.prefix.image_grid.thw) for b in stacked if b.prefix.image_grid is not None)
    assert held >= real
    coordinated = learner()
    got = coordinated.update([coordinated.global_batch(mb) for mb in stacked])
    for key in ("loss", "grad_norm", "entropy", "num_tokens", "loss_denominator", "ref_kl"):
        np.testing.assert_allclose(got[key], expected[key], rtol=2e-6, atol=1e-9, err_msg=key)
    for a, b in zip(jax.tree.leaves(nnx.state(coordinated.model)), jax.tree.leaves(nnx.state(reference.model))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_processes_with_different_policies_are_refused_naming_them():
    """A coordinated run's processes must hand the learner the same policy: one parameter off
    by one float32 step on one process fails every process, naming it."""
    state = {"layer": {"kernel": np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4), "bias": np.zeros(4)}}
    processes = thread_processes(3)
    on_threads(processes, lambda p: check_same_state(state, p, "the policy"))  # alike: nothing raised
    other = {"layer": {"kernel": state["layer"]["kernel"].copy(), "bias": np.zeros(4)}}
    other["layer"]["kernel"][2, 3] = np.nextafter(np.float32(1), np.float32(2))

    def check(p):
        try:
            check_same_state(other if p.index == 2 else state, p, "the policy")
        except RuntimeError as error:
            return str(error)

    errors = on_threads(processes, check)
    assert all(e is not None and e.startswith("the policy differs between processes: process(es) [2]") for e in errors)


CHECKED = [
    ({"rollout__seed_per_turn": False}, "config.rollout.seed_per_turn"),
    ({"eval__enabled": True, "eval__seed_per_turn": False}, "config.eval.seed_per_turn"),
]


def _coordinated_config(**overrides):
    fields = dict(
        model__name="tiny_qwen3",
        env__observation="text",
        env__include_dom_text=True,
        rollout__seed_per_turn=True,
        train__coordinated=True,
    )
    return tiny_config("/tmp/unused", **{**fields, **overrides})


def test_coordinated_settings_accept_the_supported_run():
    settings = TrainSettings.from_config(_coordinated_config())
    assert settings.train.coordinated
    config = _coordinated_config(train__mode="async", train__staleness_window=2, learner__old_logprobs="rollout")
    settings = TrainSettings.from_config(config)
    assert settings.train.coordinated and settings.train.mode == "async"
    # Each process's engines may be JAX samplers in Ray actors or vLLM engines, and the
    # evaluations split their seeds across the processes.
    for overrides in ({"rollout__worker_backend": "ray"}, {"rollout__engine": "vllm"}, {"eval__enabled": True}):
        assert TrainSettings.from_config(_coordinated_config(**overrides)).train.coordinated, overrides


@pytest.mark.parametrize(("overrides", "field"), CHECKED, ids=[field for _, field in CHECKED])
def test_coordinated_mode_refuses_what_it_does_not_split(overrides, field):
    with pytest.raises(ConfigError, match=f"^{field}: train.coordinated"):
        TrainSettings.from_config(_coordinated_config(**overrides))


def test_coordinated_mode_takes_screenshots():
    config = _coordinated_config(model__name="tiny_qwen3_vl", env__observation="screenshot")
    assert TrainSettings.from_config(config).train.coordinated


# -- async mode (each process's rollout threads and buffer; a global policy version) ------------


def _rollout_group(group_id: int, version: int):
    from cua_jax.train.buffer import RolloutGroup

    episode = Episode(f"t/g{group_id}/e0", "t", group_id, "", [], policy_version=version)
    return RolloutGroup(group_id, "t", [episode])


def test_async_draw_shares_deal_each_draw_with_ids_numbered_by_the_draw():
    """Each process's rollout threads collect their share of every draw with no exchange: the
    shares of a draw are the one-process draw's (tasks, seeds), dealt as `partition_groups`
    deals them, with group ids draw x batch_tasks + position whichever order draws run in."""
    import jax

    from cua_jax.train.collect import GroupCollector

    def no_exchange(value):
        raise AssertionError("an async draw made a collective")

    def collector(share):
        config = tiny_config("/tmp/unused", rollout__batch_tasks=3)
        config.env.tasks = tuple((task, 0) for task in ("click-button", "click-tab", "click-widget", "focus-text"))
        settings = TrainSettings.from_config(config)
        pool = settings.catalog.pool(settings.domain_weights, settings.training_tasks)
        return GroupCollector(settings, jax.random.key(7), FakeWorker({}), pool, share)

    one = collector(None)
    shares = [collector(ProcessGroup(p, 2, no_exchange)) for p in range(2)]
    for draw in (0, 1, 2, 3):
        expected = one.draw_requests(draw)
        mine = [c.draw_requests(draw) for c in reversed(shares)][::-1]  # the processes' order does not matter
        for p, requests in enumerate(mine):
            assert [(t, s) for t, s, _ in requests] == [(t, s) for k, (t, s, _) in enumerate(expected) if k % 2 == p]
            assert [g for _, _, g in requests] == [draw * 3 + k for k in range(3) if k % 2 == p]
    groups, _ = shares[1].collect(5)  # collect runs the share: group 5 x 3 + 1 only
    assert [g.group_id for g in groups] == [16] and shares[1].default_worker.requests[0][2] == 16
    assert step_share(3, 2, 0) == 2 and step_share(3, 2, 1) == 1 and step_share(2, 3, 2) == 0


def test_processes_take_their_async_groups_together():
    """`take_agreed`: a process whose groups are in waits (exchanging, not blocked in a
    collective) for one whose groups come later, then both take theirs at the global version,
    stale ones dropped and counted; a rollout thread's error on one process, or a timeout,
    raises on every process and loses no group."""
    from cua_jax.train.async_rollouts import RolloutFeeder

    feeders = [RolloutFeeder(staleness_window=1, capacity=4) for _ in range(2)]
    feeders[0].buffer.put(_rollout_group(0, 0))
    feeders[0].buffer.put(_rollout_group(2, 2))
    feeders[1].buffer.put(_rollout_group(1, 0))
    late_put = threading.Event()

    def put_late():
        late_put.set()  # before the put: a process returning after the put always sees it set
        feeders[1].buffer.put(_rollout_group(3, 2))

    threading.Timer(0.3, put_late).start()

    def take(p):
        groups = feeders[p.index].take_agreed(1, 2, p, 30.0, poll_s=0.05)
        return groups, late_put.is_set()  # process 0 returns only once process 1's group is in

    taken = on_threads(thread_processes(2), take)
    assert [after_late_put for _, after_late_put in taken] == [True, True]
    taken = [result for result, _ in taken]
    assert [[g.group_id for g in groups] for groups, _ in taken] == [[2], [3]]
    assert [f.buffer.dropped_stale_groups for f in feeders] == [1, 1]  # version 0 at version 2, window 1

    feeders[0].buffer.put(_rollout_group(4, 2))
    with pytest.raises(TimeoutError, match=r"process\(es\) \[1\] waited 0.2s"):
        on_threads(thread_processes(2), lambda p: feeders[p.index].take_agreed(1, 2, p, 0.2, poll_s=0.05))
    assert len(feeders[0].buffer) == 1  # nothing taken

    def fails(draw, worker):
        raise OSError("the browser went away")

    feeders[1].start([object()], fails)
    with pytest.raises(RuntimeError, match="process 1: OSError: the browser went away"):
        on_threads(thread_processes(2), lambda p: feeders[p.index].take_agreed(1, 2, p, 30.0, poll_s=0.05))
    assert len(feeders[0].buffer) == 1
    feeders[1].stop()


def test_each_process_state_is_kept_per_checkpoint_step(tmp_path):
    """Each process's own TrainerState beside the Orbax checkpoints: read back as written, by
    process; a checkpoint written by another number of processes, or lacking this process's
    file, is named; a later save removes the files of steps no longer kept."""
    from cua_jax.train.checkpoint import TrainCheckpointer, TrainerState

    def state(step, process):
        return TrainerState(
            np.zeros(2, np.uint32), step, step, 0, [{"calls": process}], {"p": process}, {}, {"buffer": [process]}
        )

    checkpointer = TrainCheckpointer(str(tmp_path / "checkpoints"))
    try:
        for process in range(2):
            checkpointer.write_process_state(state(3, process), process)
        for process in range(2):
            read = checkpointer.read_process_state(3, process, 2)
            assert (read.step, read.sampler, read.rollouts) == (3, {"p": process}, {"buffer": [process]})
        with pytest.raises(ValueError, match=r"of 2 processes .* this run has 4 \(config.mesh.num_processes\)"):
            checkpointer.read_process_state(3, 0, 4)
        with pytest.raises(ValueError, match="own state of 0 processes"):
            checkpointer.read_process_state(5, 0, 2)
        checkpointer.write_process_state(state(4, 0), 0)
        checkpointer.prune_process_states(0, 4)  # Orbax keeps no step here: only step 4's stays
        assert sorted(p.name for p in (tmp_path / "process_states").glob("*/*")) == ["process_0.npz", "process_1.npz"]
        assert not (tmp_path / "process_states" / "3" / "process_0.npz").exists()
    finally:
        checkpointer.close()
