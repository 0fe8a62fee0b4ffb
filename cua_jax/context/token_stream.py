"""The token-ID stream of ScaleCUA Algorithm 2 (§3.4, App. C.1).

A `TokenStream` is the running concatenation (ids, loss mask, rollout logprobs) of one training
item. `TokenStreamBuilder` grows it turn by turn, token-in token-out:

* a response is appended exactly as the engine sampled it (loss mask 1, the engine's logprobs);
  nothing the policy generated is ever re-tokenized into the stream;
* an observation is appended as the token diff Tokenize(H + o)[len(Tokenize(H)):] (loss mask 0),
  where H is the rendered history. Before taking a diff the builder checks that the rendering of H
  is an exact prefix of the rendering of H + o; a chat template that moves earlier tokens (e.g. one
  that strips the reasoning of past turns) raises `PrefixMismatchError` naming the turn, instead of
  silently misaligning ids and logprobs.

The tokens a chat template adds after a response (ChatML's "<|im_end|>\\n" minus what the engine
emitted) are taken from the rendering and appended with loss mask 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from cua_jax.context.render import ChatRenderer, PlacedImage, Rendered
from cua_jax.types import ImageSpan, TrainingItem


class PrefixMismatchError(ValueError):
    """The chat template rendered earlier tokens differently once a turn was added."""


@dataclasses.dataclass(frozen=True)
class Prompt:
    """What the engine is asked to continue: ids (int32 [L]) and the images placed in them."""

    ids: np.ndarray
    images: tuple[ImageSpan, ...]


class TokenStream:
    """Aligned (ids, loss mask, rollout logprobs) chunks plus image spans; `to_item` makes a TrainingItem."""

    def __init__(self) -> None:
        self._ids: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self._logprobs: list[np.ndarray] = []
        self.images: list[ImageSpan] = []
        self.step_indices: list[int] = []
        self.length = 0

    def append_context(self, ids: np.ndarray, images: Sequence[PlacedImage] = (), offset: int = 0) -> None:
        """Append non-trainable tokens; `images` are placed at rendered positions, shifted by -offset."""
        ids = np.asarray(ids, dtype=np.int32)
        for placed in images:
            if not (0 <= placed.start - offset and placed.end - offset <= len(ids)):
                raise ValueError(f"image span [{placed.start}, {placed.end}) outside the appended tokens")
            start, end = self.length + placed.start - offset, self.length + placed.end - offset
            self.images.append(ImageSpan(start, end, placed.ref.turn, placed.ref.index, placed.grid_thw))
        self._append(ids, np.zeros(len(ids), np.int32), np.zeros(len(ids), np.float32))

    def append_response(self, turn: int, ids: np.ndarray, logprobs: np.ndarray) -> None:
        """Append a response exactly as sampled: loss mask 1, the engine's logprobs."""
        ids = np.asarray(ids, dtype=np.int32)
        logprobs = np.asarray(logprobs, dtype=np.float32)
        if ids.ndim != 1 or ids.shape != logprobs.shape:
            raise ValueError(f"turn {turn}: response ids {ids.shape} and logprobs {logprobs.shape} must be equal 1-D")
        if len(ids) == 0:
            raise ValueError(f"turn {turn}: empty response")
        self.step_indices.append(turn)
        self._append(ids, np.ones(len(ids), np.int32), logprobs)

    def _append(self, ids: np.ndarray, mask: np.ndarray, logprobs: np.ndarray) -> None:
        self._ids.append(ids)
        self._mask.append(mask)
        self._logprobs.append(logprobs)
        self.length += len(ids)

    @property
    def ids(self) -> np.ndarray:
        return np.concatenate(self._ids) if self._ids else np.zeros(0, np.int32)

    def prompt(self) -> Prompt:
        return Prompt(self.ids, tuple(self.images))

    def to_item(self, episode_id: str, group_id: int) -> TrainingItem:
        return TrainingItem(
            ids=self.ids,
            loss_mask=np.concatenate(self._mask),
            rollout_logprobs=np.concatenate(self._logprobs),
            images=list(self.images),
            episode_id=episode_id,
            group_id=group_id,
            step_indices=tuple(self.step_indices),
        )


class TokenStreamBuilder:
    """Grows a `TokenStream` over a conversation by token diffs (ScaleCUA Algorithm 2, lines 6-16).

    Starts from `messages` (the history H, ending with a user observation), tokenized with the
    generation prompt and loss mask 0. Then alternates `add_response` and `add_observation`.
    `prompt()` is exactly what the engine must continue at each turn.
    """

    def __init__(self, renderer: ChatRenderer, messages: Sequence[dict[str, Any]], turn: int):
        self.renderer = renderer
        self.messages: list[dict[str, Any]] = list(messages)
        # Tokenize(H) as rendered by the template: what every diff is taken against.
        self._rendered: Rendered = renderer.render(self.messages, add_generation_prompt=True)
        self._awaiting_response = True
        self._turn = turn
        self.stream = TokenStream()
        self.stream.append_context(self._rendered.ids, self._rendered.images)

    def prompt(self) -> Prompt:
        if not self._awaiting_response:
            raise ValueError(f"turn {self._turn} already has its response; add the next observation first")
        return self.stream.prompt()

    def add_response(self, turn: int, ids: np.ndarray, logprobs: np.ndarray, text: str) -> None:
        """Append the engine's response ids/logprobs; `text` (its decoded content) extends H for later diffs."""
        if not self._awaiting_response or turn != self._turn:
            raise ValueError(
                f"response for turn {turn} out of order "
                f"(expecting {'response' if self._awaiting_response else 'observation'} of turn {self._turn})"
            )
        self.messages.append({"role": "assistant", "content": text})
        rendered = self.renderer.render(self.messages, add_generation_prompt=False)
        before = self._rendered.ids
        # The generation prompt's text after its last added token ("assistant\n") may merge with the
        # response's leading text under BPE ("\n" + "\n..." -> "\n\n..."). The stream holds the
        # engine's tokens there, so only that boundary may re-tokenize: everything up to the last
        # added token must be identical, and the text after it must still begin the rendering.
        tokenizer = self.renderer.tokenizer
        stable = _after_last_added_token(before, self.renderer.added_token_ids)
        _check_prefix(before[:stable], rendered.ids, turn, "its response", tokenizer)
        header = tokenizer.decode(before[stable:].tolist())
        if not tokenizer.decode(rendered.ids[stable:].tolist()).startswith(header):
            raise PrefixMismatchError(
                f"turn {turn}: adding its response changed the generation prompt's text {header!r}"
            )
        turn_tokens = rendered.ids[stable:]
        closers = np.flatnonzero(turn_tokens == self.renderer.end_of_turn_id)
        if len(closers) == 0:
            raise ValueError(f"turn {turn}: the chat template closed the assistant turn without the end-of-turn token")
        ids = np.asarray(ids, dtype=np.int32)
        # The template's tokens after the response that the engine did not emit (mask 0).
        emitted_end = len(ids) > 0 and ids[-1] == self.renderer.end_of_turn_id
        closing = turn_tokens[closers[-1] + 1 :] if emitted_end else turn_tokens[closers[-1] :]
        self.stream.append_response(turn, ids, logprobs)
        self.stream.append_context(closing)
        self._rendered = rendered
        self._awaiting_response = False

    def add_observation(self, turn: int, message: dict[str, Any]) -> None:
        """Append the diff Tokenize(H + o)[len(Tokenize(H)):] (observation + generation prompt), mask 0."""
        if self._awaiting_response or turn != self._turn + 1:
            raise ValueError(
                f"observation for turn {turn} out of order "
                f"(turn {self._turn} awaits {'its response' if self._awaiting_response else 'the next observation'})"
            )
        self.messages.append(message)
        rendered = self.renderer.render(self.messages, add_generation_prompt=True)
        before = self._rendered.ids
        _check_prefix(before, rendered.ids, turn, "its observation", self.renderer.tokenizer)
        offset = len(before)
        new_images = [placed for placed in rendered.images if placed.start >= offset]
        if len(rendered.images) - len(new_images) != len(self._rendered.images):
            raise PrefixMismatchError(f"turn {turn}: adding its observation moved an earlier image")
        self.stream.append_context(rendered.ids[offset:], new_images, offset=offset)
        self._rendered = rendered
        self._turn = turn
        self._awaiting_response = True


def _after_last_added_token(ids: np.ndarray, added_token_ids: np.ndarray) -> int:
    """1 + the position of the last added (special) token in `ids`; 0 when there is none."""
    positions = np.flatnonzero(np.isin(ids, added_token_ids))
    return int(positions[-1]) + 1 if len(positions) else 0


def _check_prefix(before: np.ndarray, after: np.ndarray, turn: int, what: str, tokenizer) -> None:
    """Raise PrefixMismatchError unless `before` is a prefix of `after`."""
    n = len(before)
    head = after[:n]
    if len(head) == n and np.array_equal(head, before):
        return
    differs = np.flatnonzero(head != before[: len(head)])
    at = int(differs[0]) if len(differs) else len(head)
    was = tokenizer.decode(before[at : at + 8].tolist())
    now = tokenizer.decode(after[at : at + 8].tolist())
    raise PrefixMismatchError(
        f"turn {turn}: adding {what} changed the chat template's earlier tokens at position {at} "
        f"({was!r} became {now!r}); the token-diff stream would misalign ids and logprobs"
    )
