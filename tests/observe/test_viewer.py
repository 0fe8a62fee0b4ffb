"""The trajectory viewer: what save_traces records, and the static site it makes, opened in
the system Chromium (no console errors, markers, token shading, filters, two runs compared)."""

from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest
from PIL import Image, ImageDraw

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob import CHROMIUM_ARGS
from cua_jax.eval.held_out import save_traces, save_training_traces, turn_logprobs_from_items
from cua_jax.observe import viewer
from cua_jax.observe.episode_log import EpisodeLog
from cua_jax.observe.viewer import build_site, read_run
from cua_jax.types import Episode, EpisodeStatus, Fault, FaultKind, TrainingItem, Turn

WIDTH, HEIGHT = 160, 210
VERSION = 7  # the policy's version when the traces are saved


class CharTokenizer:
    """Tokens of up to four characters (ids index a growing vocabulary)."""

    def __init__(self) -> None:
        self.vocab: list[str] = []

    def encode(self, text: str) -> list[int]:
        ids = []
        for start in range(0, len(text), 4):
            piece = text[start : start + 4]
            if piece not in self.vocab:
                self.vocab.append(piece)
            ids.append(self.vocab.index(piece))
        return ids

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


def screenshot(seed: int, label: str) -> np.ndarray:
    """A MiniWoB-like page: the instruction bar, a few buttons and a text box."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, WIDTH, 50], fill=(255, 240, 150))
    draw.text((4, 6), label, fill="black")
    for b in range(3):
        top = 64 + 40 * b
        color = tuple(int(c) for c in rng.integers(60, 220, 3))
        draw.rectangle([20, top, 140, top + 28], fill=color, outline="black")
        draw.text((30, top + 8), f"button {b + 1}", fill="white")
    draw.rectangle([20, 186, 140, 204], outline=(90, 90, 90))
    return np.asarray(image)


def turn(
    tokenizer: CharTokenizer, action: A.Action, version: int, seed: int, observation: str = "", reward: float = 0.0
) -> Turn:
    text = f"I act on the page.\n{A.render_action(action)}"
    ids = tokenizer.encode(text)
    logprobs = -np.abs(np.random.default_rng(seed).normal(0.0, 1.5, len(ids))).astype(np.float32)
    return Turn(
        observation_text=observation,
        images=[screenshot(seed, "Click button 2")],
        response_ids=np.asarray(ids, np.int32),
        response_logprobs=logprobs,
        response_text=text,
        action=action,
        reward=reward,
        info={"policy_version": version},
    )


DOM_TEXT = (
    '[1] DIV#wrap\n  [2] BUTTON "button 1" @20,64 121x29 click=[500, 372]\n  [3] BUTTON "button 2" @20,104 121x29'
)


def episodes(tokenizer: CharTokenizer, flip: bool) -> list[Episode]:
    """Three traced episodes; `flip` swaps the first two outcomes (the other run)."""
    first, second = (
        (EpisodeStatus.FAILURE, EpisodeStatus.SUCCESS) if flip else (EpisodeStatus.SUCCESS, EpisodeStatus.FAILURE)
    )
    return [
        Episode(
            "click-button/g-1/e0",
            "click-button",
            -1,
            "Click button 2.",
            [turn(tokenizer, A.Click("left_click", 500, 600), 5, 1), turn(tokenizer, A.Done(), 6, 2, reward=1.0)],
            reward=float(first is EpisodeStatus.SUCCESS),
            status=first,
            policy_version=5,
            info={"seed": 100},
        ),
        Episode(
            "drag-box/g-2/e0",
            "drag-box",
            -2,
            "Drag the box down.",
            [turn(tokenizer, A.LeftClickDrag(500, 800, 500, 400), 6, 3)],
            reward=float(second is EpisodeStatus.SUCCESS),
            status=second,
            policy_version=6,
            info={"seed": 200},
        ),
        Episode(
            "click-button/g-3/e0",
            "click-button",
            -3,
            "Click button 2.",
            [turn(tokenizer, A.ClickElement(3), 6, 4, observation=DOM_TEXT)],
            status=EpisodeStatus.QUARANTINED,
            fault=Fault(FaultKind.BROWSER_CRASHED, "the page closed"),
            policy_version=6,
            info={"seed": 300},
        ),
    ]


def make_run(path, flip: bool = False) -> list[Episode]:
    """A run directory: metrics.jsonl, episodes.jsonl and traces/after/<k>/ with screenshots."""
    tokenizer = CharTokenizer()
    traced = episodes(tokenizer, flip)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for step in range(6):
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "reward/mean": 0.1 * step + (0.05 if flip else 0.0),
                        "success/rate": 0.12 * step,
                        "learner/loss": 1.0 / (step + 1),
                    }
                )
                + "\n"
            )
    log = EpisodeLog(os.path.join(path, "episodes.jsonl"))
    for step in range(3):
        log.append(step, traced, {"click-button": "miniwob", "drag-box": "miniwob"})
    learner = {e.episode_id: [t.response_logprobs + np.float32(0.3) for t in e.turns] for e in traced}
    advantages = {e.episode_id: a for e, a in zip(traced, (0.8, -0.4, 0.0))}
    save_traces(os.path.join(path, "traces", "after"), traced, tokenizer, learner, advantages, VERSION)
    return traced


def trace(path, k: int) -> dict:
    with open(os.path.join(path, "traces", "after", f"{k:02d}", "trace.json")) as f:
        return json.load(f)


def test_save_traces_records_tokens_logprobs_points_and_versions(tmp_path):
    traced = make_run(tmp_path)
    click, drag, element = trace(tmp_path, 0), trace(tmp_path, 1), trace(tmp_path, 2)
    first = click["turns"][0]
    assert first["points"] == [list(A.grid_to_pixels(500, 600, WIDTH, HEIGHT))]
    assert first["screen_size"] == [WIDTH, HEIGHT]
    assert "".join(first["tokens"]) == traced[0].turns[0].response_text
    assert first["rollout_logprobs"] == pytest.approx(traced[0].turns[0].response_logprobs.tolist())
    assert first["learner_logprobs"] == pytest.approx((traced[0].turns[0].response_logprobs + 0.3).tolist())
    assert (first["policy_version"], first["staleness"]) == (5, VERSION - 5)
    assert (click["advantage"], click["staleness"], click["seed"], click["status"]) == (
        0.8,
        VERSION - 5,
        100,
        "success",
    )
    assert drag["turns"][0]["points"] == [
        list(A.grid_to_pixels(500, 400, WIDTH, HEIGHT)),
        list(A.grid_to_pixels(500, 800, WIDTH, HEIGHT)),
    ]
    assert element["turns"][0]["element"] == 3 and element["turns"][0]["element_box"] == [20, 104, 121, 29]
    assert element["quarantine_reason"] == "browser crashed: the page closed"
    assert os.path.exists(tmp_path / "traces" / "after" / "00" / "turn_01_0.png")


def test_save_traces_without_the_optional_records_keeps_the_old_fields(tmp_path):
    traced = episodes(CharTokenizer(), flip=False)
    save_traces(str(tmp_path), traced)
    record = json.load(open(tmp_path / "00" / "trace.json"))
    assert record["turns"][0]["tokens"] is None and record["turns"][0]["learner_logprobs"] is None
    assert record["staleness"] is None and record["advantage"] is None
    for key in ("screenshots", "observation_text", "response", "action", "invalid_action", "reward"):
        assert key in record["turns"][0]


def test_learner_logprobs_per_turn_from_items_and_training_traces(tmp_path):
    episode = episodes(CharTokenizer(), flip=False)[0]
    lengths = [len(t.response_ids) for t in episode.turns]
    items, rows = [], []
    for t, n in enumerate(lengths):  # one item per turn: 3 prompt tokens, then the response
        mask = np.r_[np.zeros(3), np.ones(n)].astype(np.int32)
        items.append(
            TrainingItem(
                np.zeros(3 + n, np.int32),
                mask,
                np.zeros(3 + n, np.float32),
                [],
                episode.episode_id,
                episode.group_id,
                (t,),
            )
        )
        rows.append(np.r_[np.full(3, 9.0), -np.arange(n) / 10 - t].astype(np.float32))
    per_turn = turn_logprobs_from_items(episode, items, rows)
    assert [p.tolist() for p in per_turn] == [
        pytest.approx((-np.arange(n) / 10 - t).tolist()) for t, n in enumerate(lengths)
    ]
    with pytest.raises(ValueError, match="its logprobs"):
        turn_logprobs_from_items(episode, items, [r[:-1] for r in rows])
    short = [
        TrainingItem(
            i.ids[:-1], i.loss_mask[:-1], i.rollout_logprobs[:-1], [], i.episode_id, i.group_id, i.step_indices
        )
        for i in items
    ]
    with pytest.raises(ValueError, match="trains"):
        turn_logprobs_from_items(episode, short, rows)

    batch = types.SimpleNamespace(
        items=items, item_advantages=np.asarray([0.5, 1.5], np.float32), episodes={episode.episode_id: episode}
    )
    asked = []
    chosen = save_training_traces(
        str(tmp_path), batch, lambda idx: asked.extend(idx) or [rows[i] for i in idx], version=VERSION, num_episodes=2
    )
    assert asked == [0, 1]  # only the chosen episode's items are scored
    assert chosen == [episode.episode_id]
    record = json.load(open(tmp_path / "00" / "trace.json"))
    assert record["advantage"] == pytest.approx(1.0)
    assert [t["advantage"] for t in record["turns"]] == [0.5, 1.5]
    assert record["turns"][1]["learner_logprobs"] == pytest.approx((-np.arange(lengths[1]) / 10 - 1).tolist())


def test_bad_run_directories_are_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        build_site([str(tmp_path / "missing")], str(tmp_path / "site"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a run directory"):
        build_site([str(tmp_path / "empty")], str(tmp_path / "site"))
    bad = tmp_path / "run" / "traces" / "after" / "00"
    bad.mkdir(parents=True)
    (bad / "trace.json").write_text('{"episode_id": 1')
    with pytest.raises(ValueError, match="trace.json: not valid JSON"):
        read_run(str(tmp_path / "run"))


@pytest.mark.browser
def test_the_site_in_chromium(tmp_path):
    from playwright.sync_api import sync_playwright

    make_run(tmp_path / "run_a")
    make_run(tmp_path / "run_b", flip=True)
    index = build_site([str(tmp_path / "run_a"), str(tmp_path / "run_b")], str(tmp_path / "site"))
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=list(CHROMIUM_ARGS))
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"failed {r.url}"))

            page.goto(f"file://{index}")
            assert page.locator("#traces tr[data-task]").count() == 3
            assert page.locator("#tasks tr[data-task]").count() == 2
            assert page.locator("svg.curve polyline").count() == 3
            page.select_option("#task-filter", "click-button")
            assert page.locator("#traces tr[data-task]:visible").count() == 2
            page.select_option("#outcome-filter", "success")
            assert page.locator("#traces tr[data-task]:visible").count() == 1
            page.select_option("#task-filter", "")
            page.select_option("#outcome-filter", "")

            page.click("#traces a >> nth=0")  # the successful click-button episode
            assert page.locator(".shot img").count() == 2
            assert page.evaluate("document.querySelector('.shot img').naturalWidth") == WIDTH
            assert page.locator(".shot svg circle.marker").count() == 1
            tokens = page.locator(".reply .tok")
            assert tokens.count() > 10
            shading = lambda: page.evaluate(
                "Array.from(document.querySelectorAll('.tok'), s => s.style.backgroundColor)"
            )
            rollout = shading()
            assert sum(c not in ("", "transparent", "rgba(0, 0, 0, 0)") for c in rollout) > 5
            page.check("input[value=gap]")
            assert shading() != rollout
            shot = np.asarray(Image.open(__import__("io").BytesIO(page.screenshot(full_page=True))).convert("L"), float)
            assert shot.std() > 20, "the episode page looks blank"

            page.goto(f"file://{tmp_path / 'site' / 'episodes' / 'after-01.html'}")
            assert page.locator(".shot svg line.drag").count() == 1
            page.goto(f"file://{tmp_path / 'site' / 'episodes' / 'after-02.html'}")
            assert page.locator(".shot svg rect.element-box").count() == 1
            assert "browser crashed" in page.inner_text("body")

            page.goto(f"file://{tmp_path / 'site' / 'compare' / 'index.html'}")
            assert page.locator("#pairs tr[data-task]").count() == 3
            page.click("#pairs a >> nth=0")
            assert page.locator(".side .column").count() == 2
            assert page.locator(".side .column >> nth=1").locator(".failure").count() >= 1
            assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
            page.goto(f"file://{tmp_path / 'site' / 'other' / 'index.html'}")
            assert page.locator("#traces tr[data-task]").count() == 3
        finally:
            browser.close()
    assert errors == []


def test_an_agent_owned_fault_and_changes_outside_the_sources_are_shown(tmp_path):
    traced = episodes(CharTokenizer(), flip=False)[:1]
    traced[0].info.update(
        end_reason="page left its task: the page went from its task to about:blank", changes_outside_sources_count=2
    )
    save_traces(str(tmp_path), traced)
    record = json.load(open(tmp_path / "00" / "trace.json"))
    assert record["end_reason"].startswith("page left its task") and record["changes_outside_sources"] == 2
    facts = viewer._episode_facts(record)
    assert "agent fault: page left its task" in facts and "changes outside the sources: 2" in facts
    record.update(end_reason="the agent declared done", changes_outside_sources=0)
    assert "agent fault" not in viewer._episode_facts(record) and "outside the sources" not in viewer._episode_facts(
        record
    )


def test_a_replayed_success_shows_what_it_copies_and_its_true_version(tmp_path):
    traced = episodes(CharTokenizer(), flip=False)[:1]
    traced[0].info["replay_of"] = "click-test/g3/e1"
    traced[0].policy_version = 2
    save_traces(str(tmp_path), traced, version=6)
    record = json.load(open(tmp_path / "00" / "trace.json"))
    assert record["replay_of"] == "click-test/g3/e1" and record["staleness"] == 4
    assert "replayed success of click-test/g3/e1, sampled by policy version 2" in viewer._episode_facts(record)
