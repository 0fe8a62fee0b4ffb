"""Does a warm-started policy read its click points off the page? How it scores the oracle's
replies on held-out pages (`HeldOutScorer`): all reply tokens, the click-point digits alone
(`click_point_items`), and those digits under a page-blind prior fitted to the training
demonstrations' clicks (`click_point_prior_nll`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np

from cua_jax.envs import actions as A
from cua_jax.train.batching import (
    MultimodalPositions,
)
from cua_jax.train.demonstrations import Demonstrations
from cua_jax.train.learner import Learner
from cua_jax.train.sft import DemonstrationData, WarmStartConfig
from cua_jax.types import TrainingItem

# The numbers of a reply's click target: a tool call's grid point (`actions.render_action`),
# or an element id, either the tool call's or the reasoning line's `[id]` (`oracle_engine.reasoning_line`).
_CLICK_TARGET = re.compile(r'"coordinate": \[([^\]]*)\]|"element": (\d+)|\[(\d+)\]')


def click_point_items(items: Sequence[TrainingItem], tokenizer) -> list[TrainingItem]:
    """The items with their loss mask narrowed to the digit tokens of the replies' click points
    (inside a tool call's `"coordinate": [x, y]`; in element actions, the id where a reply first
    writes it: the reasoning line's `[id]`, or else the tool call's `"element": id`, as a later
    copy of the id in the same reply says nothing about reading the page); items with no click
    point are dropped.

    The supervised loss over these (`Learner.evaluate`) is the policy's NLL per click-point
    digit of the oracle's replies. The page lists every element's click point
    (`miniwob.dom_to_text`), so a policy that reads its target's point off the page drives it
    towards 0, and one that guesses points from where targets usually are stays near
    `click_point_prior_nll`.
    """
    narrowed = []
    for item in items:
        trained = np.flatnonzero(item.loss_mask)
        pieces = [tokenizer.decode([int(item.ids[i])]) for i in trained]
        starts = np.cumsum([0] + [len(piece) for piece in pieces[:-1]])
        digits = np.array([piece.strip().isdigit() for piece in pieces], dtype=bool)
        mask = np.zeros_like(item.loss_mask)
        text = "".join(pieces)
        reply_ends = [m.end() for m in re.finditer(r"<\|im_end\|>|</tool_call>", text)]
        id_scored = set()  # replies (by index) whose element id was already scored
        for match in _CLICK_TARGET.finditer(text):
            group = next(g for g in (1, 2, 3) if match.group(g) is not None)
            if group > 1:
                reply = bisect.bisect_right(reply_ends, match.start())
                if reply in id_scored:
                    continue
                id_scored.add(reply)
            inside = (starts >= match.start(group)) & (starts < match.end(group))
            mask[trained[inside & digits]] = 1
        if mask.any():
            narrowed.append(dataclasses.replace(item, loss_mask=mask))
    return narrowed


def click_points(demonstrations: Demonstrations) -> list[tuple[int, ...]]:
    """The grid points (x, y) or element ids (id,) the oracle clicked or filled, every one of
    every demonstration."""
    points: list[tuple[int, ...]] = []
    for rollout in demonstrations.rollouts:
        for turn in rollout.episode.turns:
            if isinstance(turn.action, A.Click):
                points.append((turn.action.x, turn.action.y))
            elif isinstance(turn.action, A.ELEMENT_ACTIONS):
                points.append((turn.action.element,))
    return points


def click_point_prior_nll(train: Sequence[tuple[int, ...]], held_out: Sequence[tuple[int, ...]]) -> float:
    """Nats per digit of the held-out click points under a page-blind prior fitted to the
    training ones: each digit's frequency at its place (axis, number of digits, position),
    add-one smoothed over the ten digits. The number of digits is given, as a policy's digit
    NLL does not count the tokens that end a number; a policy whose click-point NLL is not
    clearly below this does not read its points off the page."""
    if not held_out:
        raise ValueError("click_point_prior_nll needs at least one held-out point")

    def placed_digits(points):  # ((axis, number of digits, position), digit) of every digit
        for point in points:
            for axis, value in enumerate(point):
                digits = str(int(value))
                yield from (((axis, len(digits), place), int(digit)) for place, digit in enumerate(digits))

    counts: collections.defaultdict = collections.defaultdict(lambda: np.zeros(10))
    for place, digit in placed_digits(train):
        counts[place][digit] += 1
    nats = [
        -math.log((counts[place][digit] + 1.0) / (counts[place].sum() + 10.0))
        for place, digit in placed_digits(held_out)
    ]
    return sum(nats) / len(nats)


@dataclasses.dataclass
class HeldOutScorer:
    """How a policy scores the oracle's replies on held-out pages (never trained on), with the
    pages' data built once so that a long run can score them again and again:
    held_out_nll (nats per reply token), held_out_click_nll (nats per click-target digit,
    `click_point_items`) and click_prior_nll (the same digits under the page-blind prior fitted
    to the training demonstrations' clicks, `click_point_prior_nll`). A click-target NLL near
    the prior's says the policy guesses where targets usually are instead of reading them off
    the page."""

    replies: DemonstrationData
    clicks: DemonstrationData | None
    prior_nll: float | None

    @classmethod
    def build(
        cls,
        train: Demonstrations,
        held_out: Demonstrations,
        renderer,
        multimodal: MultimodalPositions | None,
        config: WarmStartConfig = WarmStartConfig(),
    ) -> HeldOutScorer:
        pad_id = int(renderer.tokenizer.pad_token_id or 0)

        def data(items):
            return DemonstrationData(
                items,
                held_out.episodes,
                renderer.image_processor,
                multimodal,
                config.rows,
                config.length_multiple,
                pad_id=pad_id,
            )

        clicks = click_point_items(held_out.items, renderer.tokenizer)
        prior = click_point_prior_nll(click_points(train), click_points(held_out)) if clicks else None
        return cls(data(held_out.items), data(clicks) if clicks else None, prior)

    def __call__(self, learner: Learner) -> dict[str, float]:
        """The scores of `learner`'s current policy (its loss on these pages: for a learner
        with the supervised objective, the NLL per token)."""
        report = {"held_out_nll": learner.evaluate(self.replies.all_batches())["loss"]}
        if self.clicks is not None:
            report["held_out_click_nll"] = learner.evaluate(self.clicks.all_batches())["loss"]
            report["click_prior_nll"] = float(self.prior_nll)
        return report
