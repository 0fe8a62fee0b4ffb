"""Chat rendering: an agent's conversation -> token ids with expanded image placeholders.

The chat template (the tokenizer's, Qwen3-VL style) renders each image as one
`<|vision_start|><|image_pad|><|vision_end|>`; `ChatRenderer` then expands every image pad to the
merged patch count the image processor gives that image, exactly as transformers' Qwen-VL
processors do, and reports where each image's pads sit.

The conversation itself is built by `History`: the system prompt, the instruction, and per turn the
observation (text + screenshots) and the response text. Context management (dropping old
screenshots, collapsing old turns into an action history) is a view over the same `History`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cua_jax.context.tokenizer import image_grid_thw, merged_token_count


@dataclasses.dataclass(frozen=True)
class ImageRef:
    """A screenshot in an episode: episode.turns[turn].images[index], of height x width pixels."""

    turn: int
    index: int
    height: int
    width: int


@dataclasses.dataclass(frozen=True)
class PlacedImage:
    """An image's pads in rendered ids: [start, end) covers its merged patch tokens."""

    start: int
    end: int
    ref: ImageRef
    grid_thw: tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Rendered:
    """Token ids of a rendered conversation (int32 [L]) and the images placed in them, in order."""

    ids: np.ndarray
    images: tuple[PlacedImage, ...]


class ChatRenderer:
    """Renders chat messages with a tokenizer's chat template and an image processor's patch geometry.

    Messages are transformers chat messages; an image is a content item
    `{"type": "image", "ref": ImageRef}` (the template renders one pad for it; `render` expands it).
    Works with the shipped tiny tokenizer and with a real Qwen3-VL tokenizer and processor.
    """

    def __init__(self, tokenizer, image_processor, chat_template: str | None = None, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.chat_template = chat_template  # None: the tokenizer's own template
        self.tools = tools  # function schemas the template lists in the system turn (Qwen's <tools>)
        image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.image_pad_id = _token_id(tokenizer, image_token)
        # The token that closes an assistant turn (ChatML's <|im_end|>; the tokenizer's eos otherwise).
        vocab = tokenizer.get_vocab()
        self.end_of_turn_id = vocab["<|im_end|>"] if "<|im_end|>" in vocab else tokenizer.eos_token_id
        if self.end_of_turn_id is None:
            raise ValueError("the tokenizer has neither <|im_end|> nor an eos token to close assistant turns")
        self.merge_size = int(image_processor.merge_size)
        # Added tokens (special or not) are never merged with neighbouring text by the tokenizer.
        self.added_token_ids = np.asarray(sorted(tokenizer.get_added_vocab().values()), dtype=np.int32)
        self._grids: dict[tuple[int, int], tuple[int, int, int]] = {}  # screens come in a few sizes

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The processor's patch grid (t, h, w) for a height x width image."""
        grid = self._grids.get((height, width))
        if grid is None:
            grid = self._grids[(height, width)] = image_grid_thw(self.image_processor, height, width)
        return grid

    def image_token_count(self, height: int, width: int) -> int:
        """How many image-pad tokens a height x width image becomes."""
        return merged_token_count(self.grid_thw(height, width), self.merge_size)

    def render_text(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {} if self.chat_template is None else {"chat_template": self.chat_template}
        if self.tools is not None:
            kwargs["tools"] = self.tools
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> Rendered:
        """Render and tokenize `messages`, expanding each image pad to the image's merged patch count."""
        text = self.render_text(messages, add_generation_prompt)
        ids = np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
        refs = [item.get("ref") for message in messages for item in _content_items(message) if _is_image(item)]
        if not all(isinstance(ref, ImageRef) for ref in refs):
            raise ValueError('every image content item needs {"type": "image", "ref": ImageRef(...)} to be placed')
        pad_positions = np.flatnonzero(ids == self.image_pad_id)
        if len(pad_positions) != len(refs):
            raise ValueError(
                f"the rendered conversation has {len(pad_positions)} image pads but {len(refs)} images "
                "(text containing a literal image-pad token, or a template that does not render images)"
            )
        if not refs:
            return Rendered(ids, ())
        grids = [self.grid_thw(ref.height, ref.width) for ref in refs]
        repeats = np.ones(len(ids), dtype=np.int64)
        repeats[pad_positions] = [merged_token_count(g, self.merge_size) for g in grids]
        expanded = np.repeat(ids, repeats)
        ends = np.cumsum(repeats)
        placed = tuple(
            PlacedImage(int(ends[p] - repeats[p]), int(ends[p]), ref, grid)
            for p, ref, grid in zip(pad_positions, refs, grids)
        )
        return Rendered(expanded, placed)


def _token_id(tokenizer, token: str) -> int:
    vocab = tokenizer.get_vocab()
    if token not in vocab:
        raise ValueError(f"the tokenizer has no {token!r} token")
    return vocab[token]


def _content_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [] if content is None or isinstance(content, str) else list(content)


def _is_image(item: dict[str, Any]) -> bool:
    return item.get("type") == "image"


_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def action_text(response_text: str) -> str:
    """The action part of a response: from its first <tool_call> on when it has one, else the text
    without its <think>...</think> reasoning."""
    text = _THINK_BLOCK.sub("", response_text)
    call = text.find("<tool_call>")
    return (text[call:] if call >= 0 else text).strip()


@dataclasses.dataclass
class History:
    """The full text-and-image history of an episode (ScaleCUA's text history stream).

    `observations[t]` is turn t's (text, images); `responses[t]` its response text. Views of it
    (`messages`) drop screenshots or collapse old turns; the history itself never loses anything.
    """

    system_prompt: str
    instruction: str
    observations: list[tuple[str, tuple[ImageRef, ...]]] = dataclasses.field(default_factory=list)
    responses: list[str] = dataclasses.field(default_factory=list)

    def add_observation(self, text: str, images: Sequence[ImageRef]) -> None:
        if len(self.observations) != len(self.responses):
            raise ValueError(f"turn {len(self.observations) - 1} has an observation but no response yet")
        self.observations.append((text, tuple(images)))

    def add_response(self, text: str) -> None:
        if len(self.responses) != len(self.observations) - 1:
            raise ValueError(f"a response for turn {len(self.responses)} arrived before its observation")
        self.responses.append(text)

    @property
    def images(self) -> list[ImageRef]:
        return [ref for _, refs in self.observations for ref in refs]

    def messages(
        self,
        *,
        dropped: frozenset[tuple[int, int]] = frozenset(),
        first_full_turn: int = 0,
        action_summary: Callable[[str], str] = action_text,
        last_turn: int | None = None,
        placeholder: str = "",
    ) -> list[dict[str, Any]]:
        """Chat messages for turns [first_full_turn, last_turn] (default: all), earlier turns as an action list.

        `dropped` holds (turn, index) of screenshots left out; with `placeholder` (a format string
        over {step}, the turn's 1-based number, and {action}, `action_summary` of that turn's
        response, "" before it has one) each stands in as that short text (ScaleCUA Fig. 4's text
        in place of a dropped screenshot). Turns before `first_full_turn` are
        collapsed into a "Previous actions" list (EvoCUA-1.5 eq. 4) in the first user message.
        Ends with the last observation when that turn has no response yet.
        """
        last = len(self.observations) - 1 if last_turn is None else last_turn
        if not 0 <= first_full_turn <= last < len(self.observations):
            raise ValueError(
                f"turn range [{first_full_turn}, {last}] outside the {len(self.observations)} observed turns"
            )
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        for t in range(first_full_turn, last + 1):
            text, refs = self.observations[t]
            content: list[dict[str, Any]] = []
            if t == first_full_turn:
                preamble = self.instruction
                if first_full_turn > 0:
                    steps = "\n".join(
                        f"Step {s + 1}: {action_summary(self.responses[s])}" for s in range(first_full_turn)
                    )
                    preamble = f"{preamble}\n\nPrevious actions:\n{steps}"
                content.append({"type": "text", "text": preamble + "\n"})
            for ref in refs:
                if (ref.turn, ref.index) not in dropped:
                    content.append({"type": "image", "ref": ref})
                elif placeholder:
                    action = action_summary(self.responses[t]) if t < len(self.responses) else ""
                    content.append({"type": "text", "text": placeholder.format(step=t + 1, action=action) + "\n"})
            if text:
                content.append({"type": "text", "text": text})
            messages.append({"role": "user", "content": content})
            if t < len(self.responses):
                messages.append({"role": "assistant", "content": self.responses[t]})
        return messages
