"""Training cost of context segmentation: sliding window (ScaleCUA §3.4) vs step-wise vs whole trajectory.

Synthetic episodes of T = 10, 30, 50 turns, one 1280x800 screenshot per turn. The screenshot's
token count is the real Qwen3-VL one: transformers' Qwen-VL image processor with Qwen3-VL's
geometry and default pixel bounds (patch 16, merge 2, 65,536..16,777,216 pixels) gives a 50x80
patch grid = 1,000 image tokens. Every number is counted on the items the real segmenters produce
(the shipped tiny tokenizer renders the text, so text tokens are more numerous than under Qwen's
151k vocabulary; image tokens dominate either way).

For K = Delta in {1, 3, 5, 8, 10, 15} it prints, per strategy: training items, tokens processed
(sum of item lengths) and an attention-cost proxy (sum over items of length squared, in units of
10^6). Step-wise items see the last K screenshots (the context the rollout used), so both
strategies give the policy the same visual window. Whole trajectory does not depend on K.

    python -m experiments.benchmarks.segmentation
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import Segmenter, SlidingWindow, StepWise, WholeTrajectory
from cua_jax.context.tokenizer import build_image_processor, load_tokenizer
from cua_jax.types import Episode, Turn

TURNS = (10, 30, 50)
WINDOWS = (1, 3, 5, 8, 10, 15)
SCREEN = (800, 1280)  # height, width
# Qwen3-VL's preprocessor_config pixel bounds.
QWEN3_VL_MIN_PIXELS = 65_536
QWEN3_VL_MAX_PIXELS = 16_777_216


@dataclasses.dataclass(frozen=True)
class Cost:
    items: int
    tokens: int
    attention: int  # sum of squared item lengths

    @classmethod
    def of(cls, segmenter: Segmenter, episode: Episode) -> Cost:
        lengths = np.asarray([len(item) for item in segmenter.segment(episode)], dtype=np.int64)
        return cls(len(lengths), int(lengths.sum()), int((lengths**2).sum()))


def synthetic_episode(renderer: ChatRenderer, num_turns: int, seed: int = 0) -> Episode:
    """An episode of `num_turns` turns, each a 1280x800 screenshot and a reasoning + tool-call response."""
    rng = np.random.default_rng(seed)
    screenshot = np.zeros((*SCREEN, 3), np.uint8)  # only its shape matters; shared by every turn
    turns = []
    for t in range(num_turns):
        x, y = rng.integers(0, 1000, size=2)
        response = (
            f"<think>The page after step {t} shows the dialog; the next control to use is at ({x}, {y}). "
            "Clicking it should move the task forward.</think>\n<tool_call>\n"
            f'{{"name": "computer_use", "arguments": {{"action": "left_click", "coordinate": [{x}, {y}]}}}}\n</tool_call>'
        )
        ids = np.asarray(renderer.tokenizer(response)["input_ids"] + [renderer.end_of_turn_id], np.int32)
        logprobs = -rng.exponential(0.3, size=len(ids)).astype(np.float32)
        turns.append(Turn(f"Screenshot after step {t}.", [screenshot], ids, logprobs, response_text=response))
    return Episode(
        episode_id=f"synthetic-{num_turns}",
        task_id="synthetic",
        group_id=0,
        instruction="Open the settings dialog and enable dark mode.",
        turns=turns,
        system_prompt="You are a computer-use agent. Act with one tool call per turn.",
    )


def main() -> None:
    start = time.perf_counter()
    tokenizer = load_tokenizer()
    processor = build_image_processor(min_pixels=QWEN3_VL_MIN_PIXELS, max_pixels=QWEN3_VL_MAX_PIXELS)
    renderer = ChatRenderer(tokenizer, processor)
    image_tokens = renderer.image_token_count(*SCREEN)
    episodes = {t: synthetic_episode(renderer, t) for t in TURNS}
    response_tokens = np.mean([len(turn.response_ids) for turn in episodes[TURNS[0]].turns])
    print(
        f"segmentation cost per episode: {SCREEN[1]}x{SCREEN[0]} screenshot = {image_tokens} image tokens "
        f"(grid {renderer.grid_thw(*SCREEN)}), ~{response_tokens:.0f} response tokens per turn; "
        "counted on real segmenter output; attn = sum(len^2) / 1e6"
    )
    header = (
        f"{'T':>3} {'K=D':>4} | {'sliding: items':>14} {'tokens':>8} {'attn':>8} | "
        f"{'step-wise: items':>16} {'tokens':>8} {'attn':>8} | {'whole: items':>12} {'tokens':>7} {'attn':>8} | "
        f"{'step/sliding tokens':>19} {'attn':>6}"
    )
    print(header)
    print("-" * len(header))
    ratios = {}
    for num_turns in TURNS:
        episode = episodes[num_turns]
        whole = Cost.of(WholeTrajectory(renderer), episode)
        for k in WINDOWS:
            sliding = Cost.of(SlidingWindow(renderer, keep=k, min_removal=k), episode)
            step = Cost.of(StepWise(renderer, keep_images=k), episode)
            ratios[num_turns, k] = (step.tokens / sliding.tokens, step.attention / sliding.attention)
            print(
                f"{num_turns:>3} {k:>4} | {sliding.items:>14} {sliding.tokens:>8} {sliding.attention / 1e6:>8.1f} | "
                f"{step.items:>16} {step.tokens:>8} {step.attention / 1e6:>8.1f} | "
                f"{whole.items:>12} {whole.tokens:>7} {whole.attention / 1e6:>8.1f} | "
                f"{ratios[num_turns, k][0]:>19.2f} {ratios[num_turns, k][1]:>6.2f}"
            )
    print(f"({time.perf_counter() - start:.1f}s)")
    print(f"attention-cost ratio step-wise/sliding-window (T=50, K=5): {ratios[50, 5][1]:.2f}")
    print(f"ratio step-wise/sliding-window (T=50, K=5): {ratios[50, 5][0]:.2f}")


if __name__ == "__main__":
    main()
