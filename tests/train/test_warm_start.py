"""The supervised warm start against real MiniWoB++ capsules (system Chromium) and the JAX engine.

One module-scoped run: the oracle's demonstrations of click-button (training seeds and held-out
seeds), a short SFT of a tiny random Qwen3-VL, and a greedy evaluation on the held-out seeds.
"""

from __future__ import annotations

import asyncio
import re

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import SlidingWindow
from cua_jax.context.tokenizer import load_processor
from cua_jax.environments.capsule_env import MiniWoBEnvironment
from cua_jax.envs import actions as A
from cua_jax.envs.capsules import CapsuleRuntime
from cua_jax.envs.miniwob import DomElement, dom_from_text, dom_to_text
from cua_jax.eval.in_process import evaluate_model_in_process
from cua_jax.rollout.agent_loop import AgentConfig, AgentLoop
from cua_jax.rollout.oracle_engine import OracleDemonstrator, observation_from_prompt
from cua_jax.train.demonstrations import collect_demonstrations
from cua_jax.train.sft import DemonstrationData, SupervisedRun, WarmStartConfig
from cua_jax.train.warm_start_diagnostics import click_point_items, click_point_prior_nll, click_points
from cua_jax.types import EpisodeStatus

TASK = "click-button"  # one turn, one length bucket: one compiled train step
TRAIN_SEEDS = tuple(range(12))
HELD_OUT_SEEDS = (1000, 1001, 1002, 1003)
SFT = WarmStartConfig(
    steps=300, rows=2, learning_rate=3e-3, warmup_steps=5, length_multiple=256, schedule="cosine", min_lr_ratio=0.05
)


# ------------------------------------------------------------------------------------
# Pure pieces
# ------------------------------------------------------------------------------------


_DOM_ELEMENTS = st.builds(
    lambda tag, element_id, classes, text, value, focused, box: (tag, element_id, classes, text, value, focused, box),
    st.sampled_from(["DIV", "BUTTON", "INPUT_text", "INPUT_checkbox", "LABEL", "SPAN"]),
    st.sampled_from(["", "subbtn", "area"]),
    st.sampled_from(["", "alink", "ui-dialog-titlebar-close x"]),
    st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=8),
    st.sampled_from([None, True, False, "", "abc", "it's"]),
    st.booleans(),
    st.tuples(*(st.integers(-5, 300) for _ in range(2)), *(st.integers(0, 300) for _ in range(2))),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_DOM_ELEMENTS, st.integers(0, 3)), min_size=1, max_size=8))
def test_dom_from_text_inverts_dom_to_text(specs):
    """Any flattened tree (depths grow by at most one per line) survives the round trip."""
    elements, depth_stack = [], []
    for i, ((tag, element_id, classes, text, value, focused, (left, top, width, height)), up) in enumerate(specs):
        depth = 0 if not elements else max(0, min(elements[-1].depth + 1, elements[-1].depth + 1 - up))
        del depth_stack[depth:]
        elements.append(
            DomElement(
                ref=i + 1,
                parent=depth_stack[-1] if depth_stack else None,
                depth=depth,
                tag=tag,
                text=text,
                left=float(left),
                top=float(top),
                width=float(width),
                height=float(height),
                id=element_id,
                classes=classes,
                value=None if value == "" else value,
                focused=focused,
            )
        )
        depth_stack.append(i + 1)
    parsed = dom_from_text(dom_to_text(tuple(elements)))
    assert dom_to_text(parsed) == dom_to_text(tuple(elements))
    assert [(e.ref, e.parent, e.depth, e.tag, e.text, e.value) for e in parsed] == [
        (e.ref, e.parent, e.depth, e.tag, e.text, e.value) for e in elements
    ]


@settings(max_examples=60, deadline=None)
@given(st.tuples(*(st.integers(-40, 300) for _ in range(2)), *(st.integers(0, 300) for _ in range(2))))
def test_dom_text_click_point_is_where_the_oracle_clicks(box):
    from cua_jax.envs.miniwob_oracle import OracleError, click_element

    left, top, width, height = box
    element = DomElement(
        ref=1,
        parent=None,
        depth=0,
        tag="BUTTON",
        text="ok",
        left=float(left),
        top=float(top),
        width=float(width),
        height=float(height),
    )
    line = dom_to_text((element,))
    try:
        click = click_element(element, 160, 210)
    except OracleError:
        assert "click=" not in line  # nothing of it is inside the task region
    else:
        assert line.endswith(f" click=[{click.x}, {click.y}]")


def test_dom_from_text_names_a_bad_line():
    with pytest.raises(ValueError, match="not a DOM text line"):
        dom_from_text("[1] BODY @0,0 500x210\nnonsense")


def test_observation_from_prompt_needs_dom_text():
    prompt = "<|im_start|>user\nClick on the button.\nno page here<|im_end|>\n"
    with pytest.raises(ValueError, match="include_dom_text"):
        observation_from_prompt(prompt, TASK, np.zeros((210, 160, 3), np.uint8))


def test_cosine_warm_start_decays_to_its_floor_at_the_last_step():
    from cua_jax.train.learner import learning_rate_schedule

    config = WarmStartConfig(steps=50, learning_rate=3e-3, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    lr = learning_rate_schedule(config.optimizer())
    assert float(lr(10)) == pytest.approx(3e-3)
    assert float(lr(30)) == pytest.approx(3e-3 * (0.1 + 0.9 * 0.5), rel=1e-5)
    assert float(lr(50)) == pytest.approx(3e-4, rel=1e-5)
    constant = learning_rate_schedule(WarmStartConfig(steps=50, learning_rate=3e-3, warmup_steps=10).optimizer())
    assert float(constant(50)) == pytest.approx(3e-3)


def test_config_and_task_errors():
    with pytest.raises(ValueError, match="rows"):
        WarmStartConfig(rows=0)
    with pytest.raises(ValueError, match="schedule"):
        WarmStartConfig(schedule="linear")
    with pytest.raises(ValueError, match="no script"):
        collect_demonstrations(["click-pie"], [0], runtime=None, segmenter=None)


def _prior_reference(train, held_out):
    """click_point_prior_nll by counting strings, independently of the library's arrays."""
    import collections
    import math

    seen = collections.Counter()
    for point in train:
        for axis, value in enumerate(point):
            for place, digit in enumerate(str(value)):
                seen[axis, len(str(value)), place, digit] += 1
    nats = []
    for point in held_out:
        for axis, value in enumerate(point):
            for place, digit in enumerate(str(value)):
                total = sum(seen[axis, len(str(value)), place, d] for d in "0123456789")
                nats.append(-math.log((seen[axis, len(str(value)), place, digit] + 1) / (total + 10)))
    return sum(nats) / len(nats)


_POINTS = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(_POINTS, _POINTS)
def test_click_point_prior_nll_matches_counting(train, held_out):
    assert click_point_prior_nll(train, held_out) == pytest.approx(_prior_reference(train, held_out), rel=1e-12)


def test_click_point_prior_nll_values():
    # Each digit seen once at its place: p = (1 + 1) / (1 + 10) for every held-out digit.
    assert click_point_prior_nll([(119, 753)], [(119, 753)]) == pytest.approx(-np.log(2 / 11))
    # A number length never seen in training: the uniform digit, log 10 nats.
    assert click_point_prior_nll([(119, 753)], [(5, 7)]) == pytest.approx(np.log(10))
    with pytest.raises(ValueError, match="held-out"):
        click_point_prior_nll([(1, 2)], [])


def test_click_point_items_keep_exactly_the_click_point_digits(renderer):
    """The prompt's click points and the reply's other digits stay out of the narrowed mask;
    both replies of a two-turn item count; an item whose replies click nothing is dropped."""
    from cua_jax.types import TrainingItem

    tokenizer = renderer.tokenizer

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    def item(parts):
        ids = [i for text, _ in parts for i in encode(text)]
        mask = [int(trained) for text, trained in parts for _ in encode(text)]
        return TrainingItem(
            np.array(ids, np.int32), np.array(mask, np.int32), np.zeros(len(ids), np.float32), [], "e", 0, (0,)
        )

    click = A.render_action(A.Click(kind="left_click", x=119, y=753))
    again = A.render_action(A.Click(kind="left_click", x=8, y=1000))
    typing = A.render_action(A.Type(text="42"))
    items = [
        item(
            [
                ("page: [10] BUTTON 'No' @2,148 34x21 click=[119, 753]\n", False),
                (f"Click BUTTON 'No' 2.\n{click}", True),
                ("next page click=[5, 6]\n", False),
                (again, True),
            ]
        ),
        item([("page\n", False), (typing, True)]),
    ]
    narrowed = click_point_items(items, tokenizer)
    assert len(narrowed) == 1
    kept = narrowed[0].ids[narrowed[0].loss_mask == 1]
    assert tokenizer.decode(kept.tolist()) == "119753" + "81000"
    assert set(np.flatnonzero(narrowed[0].loss_mask)) <= set(np.flatnonzero(items[0].loss_mask))
    # Element ids: where a reply first writes the id (its reasoning line's [id]), not the tool
    # call's copy of it; a reply without a reasoning line has only the tool call's.
    by_id = item(
        [
            ("page: BUTTON 'No' [10]\n", False),
            (f"Click BUTTON 'No' [10].\n{A.render_action(A.ClickElement(10))}", True),
            ("page: INPUT_text [3]\n", False),
            (A.render_action(A.FillElement(3, "25")), True),
        ]
    )
    kept = click_point_items([by_id], tokenizer)[0]
    assert tokenizer.decode(kept.ids[kept.loss_mask == 1].tolist()) == "10" + "3"
    assert tokenizer.decode(kept.ids[: np.flatnonzero(kept.loss_mask)[0]].tolist()).endswith("Click BUTTON 'No' [")


# ------------------------------------------------------------------------------------
# Against real capsules
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def renderer():
    tokenizer, image_processor = load_processor()
    return ChatRenderer(tokenizer, image_processor)


@pytest.fixture(scope="module")
def segmenter(renderer):
    return SlidingWindow(renderer, keep=5, min_removal=5)


@pytest.fixture(scope="module")
def runtime():
    with CapsuleRuntime(include_dom_text=True, seed=0) as capsules:
        yield capsules


@pytest.fixture(scope="module")
def demonstrations(runtime, segmenter):
    """(training, held-out): click-button on TRAIN_SEEDS and enter-text (3 turns) on two of
    them; click-button on HELD_OUT_SEEDS."""
    train = collect_demonstrations([TASK], TRAIN_SEEDS, runtime=runtime, segmenter=segmenter)
    multi_turn = collect_demonstrations(["enter-text"], TRAIN_SEEDS[:2], runtime=runtime, segmenter=segmenter)
    held_out = collect_demonstrations([TASK], HELD_OUT_SEEDS, runtime=runtime, segmenter=segmenter)
    return train, multi_turn, held_out


@pytest.mark.browser
def test_demonstrations_train_exactly_the_oracles_replies(demonstrations, segmenter):
    """Every oracle episode succeeds with reward 1; the items' loss mask covers exactly the
    oracle's reply tokens (reasoning line + tool call + end of turn), as the segmenter replays them."""
    train, multi_turn, held_out = demonstrations
    for demos, seeds in ((train, TRAIN_SEEDS), (multi_turn, TRAIN_SEEDS[:2]), (held_out, HELD_OUT_SEEDS)):
        assert not demos.rejected and not demos.oracle_errors
        assert len(demos.rollouts) == len(seeds)
    tokenizer = segmenter.renderer.tokenizer
    rollouts = train.rollouts + multi_turn.rollouts
    for rollout in rollouts:
        episode = rollout.episode
        assert episode.status is EpisodeStatus.SUCCESS and episode.reward == 1.0
        assert episode.turns[-1].reward == 1.0
        assert episode.num_turns == (1 if episode.task_id == TASK else 3)
        replies = []
        for turn in episode.turns:
            reasoning, call = turn.response_text.split("\n", 1)
            assert reasoning.endswith(".") and A.parse_action(call) == turn.action
            assert turn.response_ids[-1] == segmenter.renderer.end_of_turn_id
            np.testing.assert_array_equal(
                turn.response_ids[:-1], tokenizer.encode(turn.response_text, add_special_tokens=False)
            )
            replies.append(turn.response_ids)
        trained = np.concatenate(
            [item.ids[item.loss_mask == 1] for item in sorted(rollout.items, key=lambda i: i.step_indices[0])]
        )
        np.testing.assert_array_equal(trained, np.concatenate(replies))
        assert sum(int(item.loss_mask.sum()) for item in rollout.items) == sum(len(r) for r in replies)
        replayed = segmenter.segment(episode)
        for item, again in zip(rollout.items, replayed, strict=True):
            np.testing.assert_array_equal(item.ids, again.ids)
            np.testing.assert_array_equal(item.loss_mask, again.loss_mask)
    clicks = [r.episode.turns[0].response_text for r in train.rollouts]
    assert all(text.startswith("Click BUTTON '") for text in clicks)


@pytest.mark.browser
def test_click_point_items_of_real_demonstrations(demonstrations, renderer):
    """On the oracle's click-button replies, the narrowed mask is the clicked point's digits."""
    train, _, _ = demonstrations
    narrowed = click_point_items(train.items, renderer.tokenizer)
    assert len(narrowed) == len(train.items)
    for item in narrowed:
        episode = train.episodes[item.episode_id]
        clicks = [t.action for t in episode.turns if isinstance(t.action, A.Click)]
        kept = renderer.tokenizer.decode(item.ids[item.loss_mask == 1].tolist())
        assert kept == "".join(f"{c.x}{c.y}" for c in clicks)
    assert len(click_points(train)) == len(train.rollouts)


@pytest.mark.browser
def test_unreadable_page_fails_the_episode_and_is_reported(runtime, renderer, segmenter):
    """An oracle asked for the wrong task finds nothing to click: it answers FAIL, the episode
    is a FAILURE, and the oracle's message is kept."""
    engine = OracleDemonstrator(renderer.tokenizer, renderer.end_of_turn_id, "click-link")
    loop = AgentLoop(engine, segmenter, AgentConfig(max_turns=2, max_new_tokens=64))

    async def one():
        env = MiniWoBEnvironment(runtime, time_limit_s=600.0)
        try:
            return await loop.run_episode(env, TASK, seed=3)
        finally:
            await env.close()

    episode = asyncio.run(one()).episode
    assert episode.status is EpisodeStatus.FAILURE and episode.turns[0].action == A.Fail()
    assert len(engine.errors) == 1 and "no link" in engine.errors[0]
    # A reply longer than max_new_tokens (a policy could not write it) fails its episode too.
    engine = OracleDemonstrator(renderer.tokenizer, renderer.end_of_turn_id, TASK)
    loop = AgentLoop(engine, segmenter, AgentConfig(max_turns=2, max_new_tokens=20))
    episode = asyncio.run(one()).episode
    assert episode.status is EpisodeStatus.FAILURE and episode.turns[0].action == A.Fail()
    assert len(engine.errors) == 1 and "more than max_new_tokens (20)" in engine.errors[0]


@pytest.fixture(scope="module")
def warm_started(demonstrations, renderer):
    """(held-out nll before, after, the run) of a short SFT of a tiny random Qwen3-VL."""
    from flax import nnx

    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
    from cua_jax.train.batching import MultimodalPositions

    train, _, held_out = demonstrations
    model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(num_hidden_layers=2), rngs=nnx.Rngs(0))
    multimodal = MultimodalPositions.of(model.config)
    data = DemonstrationData(
        train.items, train.episodes, renderer.image_processor, multimodal, SFT.rows, SFT.length_multiple
    )
    held = DemonstrationData(
        held_out.items, held_out.episodes, renderer.image_processor, multimodal, SFT.rows, SFT.length_multiple
    )
    run = SupervisedRun(model, data, SFT)
    before = run.learner.evaluate(held.all_batches())["loss"]
    run.run(SFT.steps)
    after = run.learner.evaluate(held.all_batches())["loss"]
    run.sync_model()
    return before, after, run


@pytest.mark.browser
@pytest.mark.slow
def test_short_sft_lowers_held_out_nll(warm_started):
    before, after, run = warm_started
    assert len(run.losses) == SFT.steps and all(np.isfinite(run.losses))
    assert after < 0.5 * before, (before, after)
    print(f"held-out NLL {before:.3f} -> {after:.3f}; {run.seconds:.1f} s for {SFT.steps} steps")


@pytest.mark.browser
@pytest.mark.slow
def test_warm_started_greedy_policy_acts_validly_on_held_out_seeds(warm_started, runtime, segmenter):
    _, _, run = warm_started
    seeds = tuple(range(1000, 1012))
    evaluation = evaluate_model_in_process(
        run.model,
        [TASK],
        seeds,
        runtime=runtime,
        segmenter=segmenter,
        agent_config=AgentConfig(
            max_turns=1, max_new_tokens=64, max_context_tokens=4096, temperature=0.0, batch_wait_s=None
        ),
        concurrency=len(seeds),
    )
    assert len(evaluation.episodes) == len(seeds) and evaluation.turns == len(seeds)
    replies = [e.turns[0].response_text for e in evaluation.episodes]
    # The format is learned on every page: the reasoning line, then one tool call.
    assert all(re.fullmatch(r"Click .*\.\n<tool_call>\n.*\n</tool_call>", r, flags=re.S) for r in replies), replies
    # Measured: 9 of 12 first replies valid after 300 steps. At 200 steps whether the click
    # point's digits come out in range was chaotic: 7 of 12 and 3 of 12 after changes that move
    # gradients by 1e-6 (float reassociation).
    assert evaluation.first_turn_valid_rate >= 0.5, replies
    print("warm-started greedy policy on held-out seeds:", evaluation.summary())
