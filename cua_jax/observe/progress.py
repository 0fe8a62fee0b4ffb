"""The training run's progress line: steps done, with the batch's reward and success beside them."""

from __future__ import annotations

from collections.abc import Mapping


class StepProgress:
    """A tqdm bar over a run's steps (nothing when `enabled` is False), as a context manager.

    show_gap: also show the largest engine-vs-learner logprob gap, the on-policy check of an
    engine other than the learner's own (vLLM)."""

    def __init__(self, enabled: bool, total: int, initial: int, name: str, show_gap: bool = False):
        self.bar = None
        self.show_gap = show_gap
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=name, unit="step")

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def step(self, metrics: Mapping[str, float]) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        shown = dict(
            reward=f"{metrics.get('reward/mean', float('nan')):.3f}",
            success=f"{metrics.get('success/rate', float('nan')):.2f}",
        )
        if self.show_gap:
            shown["gap_max"] = f"{metrics.get('learner/rollout_logprob_gap_max', float('nan')):.1e}"
        self.bar.set_postfix(**shown)
