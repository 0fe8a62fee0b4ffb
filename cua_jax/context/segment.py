"""Context management and segmentation: an episode -> the training items the learner sees.

Each strategy is one `Segmenter` with two uses that share the same code path, so what the engine
saw during the rollout is exactly what the learner trains on:

* `segmenter.start(...)` returns an `EpisodeContext` the rollout drives turn by turn:
  `observe(turn, text, images)`, `prompt()` (the ids to send to the engine), `respond(turn, ids,
  logprobs)`, and finally `finish()` -> training items;
* `segmenter.segment(episode)` replays a finished `Episode` through the same context.

Strategies:

* `SlidingWindow(keep=K, min_removal=Delta, placeholder_text=...)`: ScaleCUA's Visual Context
  Segmentation (Alg. 2). One token stream grows by diffs; when the history would hold more than
  K + Delta screenshots the stream is saved as an item, the oldest (at least Delta) screenshots
  are dropped (each replaced by `placeholder_text` when set, Fig. 4) and the remaining history is
  re-tokenized with loss mask 0. Each response is trained in exactly one item; no item holds more
  than K + Delta images.
* `WholeTrajectory()`: one stream over the whole episode, never pruned.
* `StepWise(keep_images=None)`: one item per turn; its context is the full history (only the last
  `keep_images` screenshots when set).
* `CompactContext(window=w)`: one item per turn; turns older than w collapse into a text action
  history and the last w turns stay in full (EvoCUA-1.5 eq. 4).

Each strategy is registered in SEGMENTERS under its config name; `make_segmenter(name, renderer,
**options)` builds one. Each takes its options as one frozen dataclass that checks them
(`SlidingWindowOptions`, ...); SEGMENTER_OPTIONS maps each name to it, and a run's config holds
its fields in the section `context.<name>` (the shared `placeholder_text` in `context`).

Every item's response tokens are the engine's ids and logprobs, untouched (token-in, token-out).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from cua_jax.context.render import ChatRenderer, History, ImageRef, action_text
from cua_jax.context.token_stream import Prompt, TokenStream, TokenStreamBuilder
from cua_jax.registry import Registry
from cua_jax.types import Episode, ImageSpan, TrainingItem

ImageLike = np.ndarray | tuple[int, int]  # a screenshot [H, W, 3], or just its (height, width)


def image_refs(turn: int, images: Sequence[ImageLike]) -> tuple[ImageRef, ...]:
    """ImageRefs for a turn's screenshots (arrays [H, W, C] or (height, width) pairs)."""
    refs = []
    for index, image in enumerate(images):
        if isinstance(image, np.ndarray):
            if image.ndim != 3 or image.shape[0] < 1 or image.shape[1] < 1:
                raise ValueError(f"turn {turn} image {index}: expected a [H, W, C] array, got shape {image.shape}")
            height, width = image.shape[:2]
        elif isinstance(image, tuple) and len(image) == 2:
            height, width = image
        else:
            raise ValueError(
                f"turn {turn} image {index}: expected a [H, W, C] array or (height, width), got {type(image).__name__}"
            )
        refs.append(ImageRef(turn, index, int(height), int(width)))
    return tuple(refs)


class EpisodeContext(abc.ABC):
    """One episode's context, driven turn by turn: observe -> prompt -> respond, then finish."""

    def __init__(self, renderer: ChatRenderer, episode_id: str, group_id: int, system_prompt: str, instruction: str):
        self.renderer = renderer
        self.episode_id = episode_id
        self.group_id = group_id
        self.history = History(system_prompt, instruction)
        self.items: list[TrainingItem] = []

    @abc.abstractmethod
    def observe(self, turn: int, text: str, images: Sequence[ImageLike]) -> None:
        """Add turn `turn`'s observation (its text and screenshots)."""

    @abc.abstractmethod
    def prompt(self) -> Prompt:
        """The token ids (and image spans) the engine must continue for the current turn."""

    @abc.abstractmethod
    def respond(self, turn: int, ids: np.ndarray, logprobs: np.ndarray) -> None:
        """Add the engine's response for turn `turn`: its sampled ids and their logprobs.

        The history keeps the response as `response_text(ids)`, so later renderings depend on the
        ids alone (the same in the rollout and in a replay).
        """

    @abc.abstractmethod
    def finish(self) -> list[TrainingItem]:
        """The episode's training items (call once, after the last response)."""

    def _add_observation(self, turn: int, text: str, images: Sequence[ImageLike]) -> None:
        if turn != len(self.history.observations):
            raise ValueError(
                f"observation for turn {turn} out of order (expected turn {len(self.history.observations)})"
            )
        self.history.add_observation(text, image_refs(turn, images))

    def response_text(self, ids: np.ndarray) -> str:
        """The response's content as the chat history holds it: decoded, without its end-of-turn token."""
        ids = np.asarray(ids)
        if len(ids) and ids[-1] == self.renderer.end_of_turn_id:
            ids = ids[:-1]
        return self.renderer.tokenizer.decode(ids.tolist(), skip_special_tokens=False)


class _StreamContext(EpisodeContext):
    """A diff-grown token stream, pruned (sliding window) when `keep` is set."""

    def __init__(
        self,
        renderer,
        episode_id,
        group_id,
        system_prompt,
        instruction,
        keep: int | None,
        min_removal: int,
        placeholder: str = "",
    ):
        super().__init__(renderer, episode_id, group_id, system_prompt, instruction)
        self.keep = keep
        self.min_removal = min_removal
        self.placeholder = placeholder
        self.dropped: set[tuple[int, int]] = set()
        self.builder: TokenStreamBuilder | None = None

    def _messages(self):
        return self.history.messages(dropped=frozenset(self.dropped), placeholder=self.placeholder)

    def observe(self, turn, text, images):
        self._add_observation(turn, text, images)
        kept = [ref for ref in self.history.images if (ref.turn, ref.index) not in self.dropped]
        over = self.keep is not None and len(kept) > self.keep + self.min_removal
        if over:  # Alg. 2 lines 9-12: save, drop the oldest screenshots, re-tokenize with loss mask 0
            if self.builder is not None and self.builder.stream.step_indices:
                self.items.append(self.builder.stream.to_item(self.episode_id, self.group_id))
            num_drop = max(self.min_removal, len(kept) - (self.keep + self.min_removal))
            self.dropped.update((ref.turn, ref.index) for ref in kept[:num_drop])
        if self.builder is None or over:
            self.builder = TokenStreamBuilder(self.renderer, self._messages(), turn)
        else:  # Alg. 2 lines 14-16: token-diff append
            self.builder.add_observation(turn, self._messages()[-1])

    def prompt(self):
        if self.builder is None:
            raise ValueError("prompt() before the first observation")
        return self.builder.prompt()

    def respond(self, turn, ids, logprobs):
        if self.builder is None:
            raise ValueError(f"turn {turn}: response before any observation")
        text = self.response_text(ids)
        self.builder.add_response(turn, ids, logprobs, text)
        self.history.add_response(text)

    def finish(self):
        if self.builder is not None and self.builder.stream.step_indices:
            self.items.append(self.builder.stream.to_item(self.episode_id, self.group_id))
            self.builder = None
        return self.items


class _StepContext(EpisodeContext):
    """One item per turn, each rendered afresh from a view of the history."""

    def __init__(
        self,
        renderer,
        episode_id,
        group_id,
        system_prompt,
        instruction,
        keep_images: int | None,
        full_turns: int | None,
        action_summary: Callable[[str], str],
        placeholder: str = "",
    ):
        super().__init__(renderer, episode_id, group_id, system_prompt, instruction)
        self.keep_images = keep_images
        self.full_turns = full_turns
        self.action_summary = action_summary
        self.placeholder = placeholder
        self._rendered = None

    def observe(self, turn, text, images):
        self._add_observation(turn, text, images)
        self._rendered = None

    def _view(self):
        turn = len(self.history.observations) - 1
        first_full = 0 if self.full_turns is None else max(0, turn - self.full_turns)
        dropped: frozenset[tuple[int, int]] = frozenset()
        if self.keep_images is not None:
            visible = [ref for ref in self.history.images if ref.turn >= first_full]
            hidden = visible[: max(0, len(visible) - self.keep_images)]
            dropped = frozenset((ref.turn, ref.index) for ref in hidden)
        return self.history.messages(
            dropped=dropped,
            first_full_turn=first_full,
            action_summary=self.action_summary,
            placeholder=self.placeholder,
        )

    def _render(self):
        if not self.history.observations or len(self.history.responses) == len(self.history.observations):
            raise ValueError("no observation awaiting a response")
        if self._rendered is None:
            self._rendered = self.renderer.render(self._view(), add_generation_prompt=True)
        return self._rendered

    def prompt(self):
        rendered = self._render()
        spans = tuple(ImageSpan(p.start, p.end, p.ref.turn, p.ref.index, p.grid_thw) for p in rendered.images)
        return Prompt(rendered.ids, spans)

    def respond(self, turn, ids, logprobs):
        if turn != len(self.history.observations) - 1:
            raise ValueError(
                f"response for turn {turn} out of order (turn {len(self.history.observations) - 1} awaits one)"
            )
        rendered = self._render()
        stream = TokenStream()
        stream.append_context(rendered.ids, rendered.images)
        stream.append_response(turn, ids, logprobs)
        self.items.append(stream.to_item(self.episode_id, self.group_id))
        self.history.add_response(self.response_text(ids))
        self._rendered = None

    def finish(self):
        return self.items


class Segmenter(abc.ABC):
    """episode -> list[TrainingItem]; `start` gives the same context to a live rollout.

    options_type: the frozen dataclass of the options a run's config sets (its fields are the
    constructor's keyword arguments of the same names, checked in its __post_init__); the other
    arguments (e.g. a callable) keep their defaults there. `self.options` holds them.
    """

    options_type: type

    def __init__(self, renderer: ChatRenderer, **options):
        self.renderer = renderer
        self.options = self.options_type(**options)

    @abc.abstractmethod
    def start(self, episode_id: str, group_id: int, system_prompt: str, instruction: str) -> EpisodeContext:
        """A fresh context for one episode."""

    def segment(self, episode: Episode) -> list[TrainingItem]:
        """Replay a finished episode through this strategy's context."""
        context = self.start(episode.episode_id, episode.group_id, episode.system_prompt, episode.instruction)
        for t, turn in enumerate(episode.turns):
            context.observe(t, turn.observation_text, turn.images)
            context.respond(t, turn.response_ids, turn.response_logprobs)
        return context.finish()


SEGMENTERS: Registry[type[Segmenter]] = Registry("segmenter")


def check_placeholder(text: str) -> str:
    """A dropped screenshot's stand-in text ("" for none): a format string over {step} and {action} only."""
    try:
        text.format(step=1, action="click(1)")
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"placeholder_text {text!r} may name only {{step}} and {{action}}: {error!r}") from None
    return text


@dataclasses.dataclass(frozen=True)
class SlidingWindowOptions:
    """SlidingWindow's options: keep K screenshots; when over K + min_removal (Delta), drop at
    least Delta, each leaving placeholder_text (config.context.sliding_window and the shared
    config.context.placeholder_text)."""

    keep: int
    min_removal: int
    placeholder_text: str

    def __post_init__(self):
        if self.keep < 0:
            raise ValueError(f"sliding window needs keep >= 0, got {self.keep}")
        if self.min_removal < 1:
            raise ValueError(f"sliding window needs min_removal >= 1, got {self.min_removal}")
        check_placeholder(self.placeholder_text)


@SEGMENTERS.register("sliding_window")
class SlidingWindow(Segmenter):
    """ScaleCUA Visual Context Segmentation: keep K screenshots, drop at least Delta when over K + Delta."""

    options_type = SlidingWindowOptions

    def __init__(
        self, renderer: ChatRenderer, keep: int = 5, min_removal: int | None = None, placeholder_text: str = ""
    ):
        min_removal = keep if min_removal is None else min_removal
        super().__init__(renderer, keep=keep, min_removal=min_removal, placeholder_text=placeholder_text)

    def start(self, episode_id, group_id, system_prompt, instruction):
        return _StreamContext(
            self.renderer,
            episode_id,
            group_id,
            system_prompt,
            instruction,
            self.options.keep,
            self.options.min_removal,
            self.options.placeholder_text,
        )


@dataclasses.dataclass(frozen=True)
class WholeTrajectoryOptions:
    """WholeTrajectory takes no options (config.context has no section for it)."""


@SEGMENTERS.register("whole_trajectory")
class WholeTrajectory(Segmenter):
    """One item per episode: the whole conversation as one diff-grown token stream."""

    options_type = WholeTrajectoryOptions

    def start(self, episode_id, group_id, system_prompt, instruction):
        return _StreamContext(self.renderer, episode_id, group_id, system_prompt, instruction, None, 1)


@dataclasses.dataclass(frozen=True)
class StepWiseOptions:
    """StepWise's options: keep_images, the screenshots each item keeps (None: all), each
    dropped one leaving placeholder_text (config.context.step_wise and the shared
    config.context.placeholder_text)."""

    keep_images: int | None
    placeholder_text: str

    def __post_init__(self):
        if self.keep_images is not None and self.keep_images < 0:
            raise ValueError(f"keep_images must be >= 0, got {self.keep_images}")
        check_placeholder(self.placeholder_text)


@SEGMENTERS.register("step_wise")
class StepWise(Segmenter):
    """One item per turn; context = full history, or its last `keep_images` screenshots when set."""

    options_type = StepWiseOptions

    def __init__(self, renderer: ChatRenderer, keep_images: int | None = None, placeholder_text: str = ""):
        super().__init__(renderer, keep_images=keep_images, placeholder_text=placeholder_text)

    def start(self, episode_id, group_id, system_prompt, instruction):
        return _StepContext(
            self.renderer,
            episode_id,
            group_id,
            system_prompt,
            instruction,
            self.options.keep_images,
            None,
            action_text,
            self.options.placeholder_text,
        )


@dataclasses.dataclass(frozen=True)
class CompactContextOptions:
    """CompactContext's options: window, the recent turns kept in full (config.context.compact_context)."""

    window: int

    def __post_init__(self):
        if self.window < 0:
            raise ValueError(f"compact context window must be >= 0, got {self.window}")


@SEGMENTERS.register("compact_context")
class CompactContext(Segmenter):
    """One item per turn (EvoCUA-1.5 eq. 4): turns older than `window` as a text action history, the rest in full."""

    options_type = CompactContextOptions

    def __init__(self, renderer: ChatRenderer, window: int = 3, action_summary: Callable[[str], str] = action_text):
        super().__init__(renderer, window=window)
        self.action_summary = action_summary

    def start(self, episode_id, group_id, system_prompt, instruction):
        return _StepContext(
            self.renderer,
            episode_id,
            group_id,
            system_prompt,
            instruction,
            None,
            self.options.window,
            self.action_summary,
        )


# Each registered segmenter's options dataclass, by name (the segmenters above are all registered):
# the one place that says which config fields each takes.
SEGMENTER_OPTIONS: dict[str, type] = {name: cls.options_type for name, cls in SEGMENTERS.items()}


def make_segmenter(name: str, renderer: ChatRenderer, **options) -> Segmenter:
    """The segmenter registered as `name`, built with `options` (its keyword arguments, e.g. the
    fields of its SEGMENTER_OPTIONS dataclass). Raises ValueError for an unknown name."""
    return SEGMENTERS[name](renderer, **options)
