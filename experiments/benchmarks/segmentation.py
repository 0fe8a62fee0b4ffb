"""Training cost of context segmentation: sliding window (ScaleCUA §3.4) vs step-wise vs whole trajectory.

Synthetic episodes of T = 10, 30, 50 turns (--turns), one 1280x800 screenshot per turn. The screenshot's
token count is the real Qwen3-VL one: transformers' Qwen-VL image processor with Qwen3-VL's
geometry and default pixel bounds (patch 16, merge 2, 65,536..16,777,216 pixels) gives a 50x80
patch grid = 1,000 image tokens. Every number is counted on the items the real segmenters produce
(the shipped tiny tokenizer renders the text, so text tokens are more numerous than under Qwen's
151k vocabulary; image tokens dominate either way).

For K = Delta in {1, 3, 5, 8, 10, 15} it prints, per strategy: training items, tokens processed
(sum of item lengths) and an attention-cost proxy (sum over items of length squared, in units of
10^6). Step-wise items see the last K screenshots (the context the rollout used), so both
strategies give the policy the same visual window. Whole trajectory does not depend on K.

Token counts are not training time (ScaleCUA's 2.83x step-wise/sliding-window figure is end-to-end
time), so with --learner (the default) it also times real learner updates at K = Delta = 5. The
tiny random Qwen3-VL (`tiny_qwen3_vl_config`) trains on the items each segmenter cuts from the same
synthetic episodes, whose turns carry 160x210 (MiniWoB-size) random screenshots that go through the
vision tower (the default small-screen processor: a 14x10 patch grid, 35 image tokens each). Each
segmenter's items are batched as `Trainer.learn` batches them (`make_minibatches` with the base
config's micro-batch shape, pixel patches and Qwen3-VL multimodal positions, one update) and
trained by `Learner.train_on_batch` (the base config's loss, old_logprobs="current"): one untimed
call compiles every shape, then the same number of timed calls per segmenter, alternating between
them. It prints the learner seconds per episode and the step-wise / sliding-window ratio of learner
time beside the token, attention-cost and padded-token ratios of those same items. With one episode
per batch (--episodes 1, the default) a segmenter's last micro-batch is padded with empty rows that
a real rollout batch would fill with other episodes' items; the padded column counts that work.

    python -m experiments.benchmarks.segmentation                          # learner timing at T = 10, 30
    python -m experiments.benchmarks.segmentation --no-learner             # token counts only (seconds)
    python -m experiments.benchmarks.segmentation --learner-turns 10 30 50 --repeats 3 --episodes 4
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

from cua_jax.context.render import ChatRenderer
from cua_jax.context.segment import Segmenter, SlidingWindow, StepWise, WholeTrajectory
from cua_jax.context.tokenizer import build_image_processor, load_tokenizer
from cua_jax.types import Episode, Turn

TURNS = (10, 30, 50)
PLACEHOLDER = "[Screenshot of step {step} removed; action: {action}]"  # experiments/configs/scalecua.py's
WINDOWS = (1, 3, 5, 8, 10, 15)
SCREEN = (800, 1280)  # height, width
# Qwen3-VL's preprocessor_config pixel bounds.
QWEN3_VL_MIN_PIXELS = 65_536
QWEN3_VL_MAX_PIXELS = 16_777_216
# Learner timing: the tiny policy on MiniWoB-size screenshots, at ScaleCUA's K = Delta = 5.
LEARNER_TURNS = (10, 30)  # T=50 (--learner-turns 10 30 50) takes several more minutes on 2 cores
LEARNER_WINDOW = 5
LEARNER_SCREEN = (210, 160)  # height, width
LEARNER_REPEATS = 2
# The base config's micro-batch shape (experiments/configs/base.py: learner.rows, learner.length_multiple).
LEARNER_BATCHING_ROWS = 4
LEARNER_LENGTH_MULTIPLE = 128


@dataclasses.dataclass(frozen=True)
class Cost:
    items: int
    tokens: int
    attention: int  # sum of squared item lengths

    @classmethod
    def of(cls, segmenter: Segmenter, episode: Episode) -> Cost:
        lengths = np.asarray([len(item) for item in segmenter.segment(episode)], dtype=np.int64)
        return cls(len(lengths), int(lengths.sum()), int((lengths**2).sum()))


def synthetic_episode(
    renderer: ChatRenderer, num_turns: int, seed: int = 0, screen: tuple[int, int] = SCREEN, pixels: bool = False
) -> Episode:
    """An episode of `num_turns` turns, each a `screen` (height, width) screenshot and a reasoning +
    tool-call response. Without `pixels` every turn shares one blank screenshot (only its shape is
    counted); with it each turn gets its own random image, for the vision tower to encode."""
    rng = np.random.default_rng(seed)
    blank = np.zeros((*screen, 3), np.uint8)
    turns = []
    for t in range(num_turns):
        screenshot = rng.integers(0, 256, size=(*screen, 3), dtype=np.uint8) if pixels else blank
        x, y = rng.integers(0, 1000, size=2)
        response = (
            f"<think>The page after step {t} shows the dialog; the next control to use is at ({x}, {y}). "
            "Clicking it should move the task forward.</think>\n<tool_call>\n"
            f'{{"name": "computer_use", "arguments": {{"action": "left_click", "coordinate": [{x}, {y}]}}}}'
            "\n</tool_call>"
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


@dataclasses.dataclass
class LearnerRun:
    """One segmenter's items of the same episodes, batched for the learner, and its timed calls."""

    cost: Cost  # of the items, per episode
    padded_tokens: int  # rows x length summed over the micro-batches, per episode
    minibatches: list
    seconds: list[float] = dataclasses.field(default_factory=list)  # timed train_on_batch calls


class LearnerBench:
    """Times `Learner.train_on_batch` on segmenter output, batched the way the trainer batches it.

    One learner serves every segmenter and episode length: its compiled programs are per batch
    shape, so a shape compiled once is reused, and an untimed first call per run compiles the rest.
    Every segmenter gets the same batching config and the same number of timed calls, taken in
    turns (sliding, step-wise, sliding, ...) so that a load change on the machine hits both alike.
    """

    def __init__(self, tokenizer, episodes_per_batch: int = 1, seed: int = 0):
        from flax import nnx

        from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
        from cua_jax.train.batching import BatchingConfig, MultimodalPositions
        from cua_jax.train.learner import Learner, LearnerConfig

        self.processor = build_image_processor()  # the default small-screen bounds the tiny policy trains with
        self.renderer = ChatRenderer(tokenizer, self.processor)
        model_config = tiny_qwen3_vl_config()
        self.multimodal = MultimodalPositions.of(model_config)
        self.batching = BatchingConfig(
            rows=LEARNER_BATCHING_ROWS, length_multiple=LEARNER_LENGTH_MULTIPLE, pad_id=int(tokenizer.pad_token_id or 0)
        )
        self.episodes_per_batch = episodes_per_batch
        model = Qwen3VLForConditionalGeneration(model_config, rngs=nnx.Rngs(seed))
        self.learner = Learner(model, LearnerConfig(old_logprobs="current"))

    def image_tokens(self) -> int:
        return self.renderer.image_token_count(*LEARNER_SCREEN)

    def episodes(self, num_turns: int) -> list[Episode]:
        """One rollout group of `episodes_per_batch` episodes with MiniWoB-size random screenshots."""
        return [
            dataclasses.replace(
                synthetic_episode(self.renderer, num_turns, seed=seed, screen=LEARNER_SCREEN, pixels=True),
                episode_id=f"synthetic-{num_turns}-{seed}",
            )
            for seed in range(self.episodes_per_batch)
        ]

    def batch(self, segmenter: Segmenter, episodes: list[Episode]) -> LearnerRun:
        """The segmenter's items of `episodes` as one update's micro-batches (as `Trainer.learn` builds them)."""
        from cua_jax.train.batching import make_minibatches, process_images

        items = [item for episode in episodes for item in segmenter.segment(episode)]
        patches = process_images(items, {episode.episode_id: episode for episode in episodes}, self.processor)
        # The advantage's value does not change the work.
        minibatches = make_minibatches(
            items, np.ones(len(items), np.float32), self.batching, 1, pixel_patches=patches, multimodal=self.multimodal
        )
        lengths = np.asarray([len(item) for item in items], dtype=np.int64)
        n = len(episodes)
        cost = Cost(round(len(lengths) / n), round(lengths.sum() / n), round((lengths**2).sum() / n))
        padded = sum(batch.rows * batch.length for micro in minibatches for batch in micro)
        return LearnerRun(cost, round(padded / n), minibatches)

    def train(self, run: LearnerRun) -> float:
        """Seconds of one train_on_batch over the run's micro-batches (it returns host floats, so the work is done)."""
        start = time.perf_counter()
        self.learner.train_on_batch(run.minibatches)
        return time.perf_counter() - start

    def time(self, runs: list[LearnerRun], repeats: int) -> list[float]:
        """Learner seconds per episode of each run: the mean of `repeats` timed calls after one compiling call."""
        for run in runs:
            self.train(run)  # compiles every (rows, length, images) shape not seen yet: untimed
        for _ in range(repeats):
            for run in runs:
                run.seconds.append(self.train(run))
        return [float(np.mean(run.seconds)) / self.episodes_per_batch for run in runs]


def learner_table(
    tokenizer, turns: tuple[int, ...], repeats: int, episodes_per_batch: int = 1
) -> dict[int, tuple[float, float, float, float]]:
    """Prints the learner-time table; returns the step-wise/sliding-window ratios of (tokens,
    attention cost, padded tokens, learner time) by T."""
    bench = LearnerBench(tokenizer, episodes_per_batch)
    k = LEARNER_WINDOW
    print(
        "\nlearner time per episode: tiny random Qwen3-VL, "
        f"{LEARNER_SCREEN[1]}x{LEARNER_SCREEN[0]} random screenshot = "
        f"{bench.image_tokens()} image tokens through the vision tower, K=D={k}; the items of {episodes_per_batch} "
        f"episode(s) batched by make_minibatches (rows {bench.batching.rows}, length multiple "
        f"{bench.batching.length_multiple}, 1 update) and trained by Learner.train_on_batch, compile untimed, "
        f"mean of {repeats} timed call(s); per episode: tokens, attn = sum(len^2) / 1e6, padded = rows x length "
        "of the micro-batches"
    )
    header = (
        f"{'T':>3} | {'sliding: items':>14} {'tokens':>7} {'attn':>7} {'padded':>7} {'learner s':>9} | "
        f"{'step-wise: items':>16} {'tokens':>7} {'attn':>7} {'padded':>7} {'learner s':>9} | "
        f"{'step/sliding tokens':>19} {'attn':>6} {'padded':>6} {'learner':>7}"
    )
    print(header)
    print("-" * len(header))
    ratios = {}
    for num_turns in turns:
        episodes = bench.episodes(num_turns)  # the same episodes for both segmenters
        sliding = bench.batch(SlidingWindow(bench.renderer, keep=k, min_removal=k), episodes)
        step = bench.batch(StepWise(bench.renderer, keep_images=k), episodes)
        sliding_s, step_s = bench.time([sliding, step], repeats)
        ratios[num_turns] = (
            step.cost.tokens / sliding.cost.tokens,
            step.cost.attention / sliding.cost.attention,
            step.padded_tokens / sliding.padded_tokens,
            step_s / sliding_s,
        )
        cells = [
            f"{run.cost.tokens:>7} {run.cost.attention / 1e6:>7.2f} {run.padded_tokens:>7} {seconds:>9.3f}"
            for run, seconds in ((sliding, sliding_s), (step, step_s))
        ]
        print(
            f"{num_turns:>3} | {sliding.cost.items:>14} {cells[0]} | {step.cost.items:>16} {cells[1]} | "
            + " ".join(f"{r:>{w}.2f}" for r, w in zip(ratios[num_turns], (19, 6, 6, 7))),
            flush=True,
        )
    return ratios


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--turns",
        type=int,
        nargs="+",
        default=list(TURNS),
        help="episode lengths T of the token-count table (default: %(default)s)",
    )
    parser.add_argument(
        "--learner",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time real learner updates (--no-learner: token counts only)",
    )
    parser.add_argument(
        "--learner-turns",
        type=int,
        nargs="+",
        default=list(LEARNER_TURNS),
        help="episode lengths T of the learner-time table (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=LEARNER_REPEATS,
        help="timed train_on_batch calls per segmenter and T, after one compiling call (default: %(default)s)",
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=1,
        help="episodes per learner batch (one group); more fill the micro-batches as a real "
        "rollout batch does, at proportionally more time (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if min(args.turns + args.learner_turns) < 1 or args.repeats < 1 or args.episodes < 1:
        parser.error("--turns, --learner-turns, --repeats and --episodes must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    """argv: the benchmark's flags (None: the defaults, as the segmentation_benchmark job runs it)."""
    args = parse_args([] if argv is None else argv)
    turns = tuple(args.turns)
    start = time.perf_counter()
    tokenizer = load_tokenizer()
    processor = build_image_processor(min_pixels=QWEN3_VL_MIN_PIXELS, max_pixels=QWEN3_VL_MAX_PIXELS)
    renderer = ChatRenderer(tokenizer, processor)
    image_tokens = renderer.image_token_count(*SCREEN)
    episodes = {t: synthetic_episode(renderer, t) for t in turns}
    response_tokens = np.mean([len(turn.response_ids) for turn in episodes[turns[0]].turns])
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
    for num_turns in turns:
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
    longest = max(turns)
    print(f"attention-cost ratio step-wise/sliding-window (T={longest}, K=5): {ratios[longest, 5][1]:.2f}")
    print(f"ratio step-wise/sliding-window (T={longest}, K=5): {ratios[longest, 5][0]:.2f}")
    # ScaleCUA Fig. 4's text in place of each dropped screenshot (scalecua.py's placeholder_text).
    plain = Cost.of(SlidingWindow(renderer, keep=5, min_removal=5), episodes[longest])
    marked = Cost.of(SlidingWindow(renderer, keep=5, min_removal=5, placeholder_text=PLACEHOLDER), episodes[longest])
    print(
        f"placeholder text for dropped screenshots (T={longest}, K=5): {marked.tokens - plain.tokens:+d} tokens "
        f"({marked.tokens / plain.tokens - 1:+.2%}), attention cost {marked.attention / plain.attention - 1:+.2%}"
    )
    if not args.learner:
        return
    learner_start = time.perf_counter()
    learner_ratios = learner_table(tokenizer, tuple(args.learner_turns), args.repeats, args.episodes)
    print(f"({time.perf_counter() - learner_start:.1f}s)")
    longest = max(args.learner_turns)
    tokens, attention, padded, seconds = learner_ratios[longest]
    print(
        f"learner-time ratio step-wise/sliding-window (T={longest}, K={LEARNER_WINDOW}): {seconds:.2f} "
        f"(tokens {tokens:.2f}, attention cost {attention:.2f}, padded tokens {padded:.2f})"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
