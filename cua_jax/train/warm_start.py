"""Supervised warm start: the oracle's demonstrations, then token-mean NLL fine-tuning.

A random policy never writes a parseable tool call, so online RL would start with no signal.
The warm start teaches the reply format (and what the oracle does) before RL:

    demonstrations  the oracle's successful episodes through the run's own agent loop, by
                    each demonstrated kind's `Demonstrator` (DEMONSTRATORS:
                    `code_demonstrations.collect_code_demonstrations` on code containers,
                    `demonstrations.collect_demonstrations` on MiniWoB capsules)
    fine-tuning     `sft.fine_tune`: a `sft.SupervisedRun` on their items
    diagnostics     the held-out pages' scores (`warm_start_diagnostics.HeldOutScorer`)

`warm_start` runs the first two on MiniWoB tasks; `run_warm_start` is a training run's warm
start, with its record written to the workdir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from flax import nnx
from tqdm import tqdm

from cua_jax.context.segment import Segmenter
from cua_jax.envs.miniwob_oracle import ORACLE_TASKS
from cua_jax.observe.metrics import TIMING_PREFIX
from cua_jax.rollout.agent_loop import AgentConfig
from cua_jax.train.code_demonstrations import collect_code_demonstrations
from cua_jax.train.demonstrations import Demonstrations, collect_demonstrations
from cua_jax.train.sft import SupervisedRun, WarmStartConfig, fine_tune
from cua_jax.train.warm_start_diagnostics import HeldOutScorer

# A kind's demonstrations: collect(tasks, seeds) -> the oracle's successful episodes of those
# tasks (the kind's task ids) on those seeds.
Collect = Callable[[Sequence[str], Sequence[int]], Demonstrations]


@dataclasses.dataclass(frozen=True)
class Demonstrator:
    """How the warm start demonstrates one environment kind's tasks.

    open(settings, segmenter, agent_config, stack) -> collect: what the kind's demonstrations
        run on (entered into `stack`, closed after the warm start), and how they are collected
        through the run's segmenter and agent loop (`settings` a `TrainSettings`).
    held_out: after the fine-tuning, the kind's tasks are also demonstrated on held-out seeds
        (warm_start.held_out_seeds) and the fine-tuned policy scored on them.
    check(specs, env) -> None: what the demonstrations need of the run, checked with its
        settings before anything starts: the specs of the run's training tasks of the kind and
        the run's `EnvSettings`; a ValueError "config.<field>: ..." names the field to change.
    """

    open: Callable[[Any, Segmenter, AgentConfig, contextlib.ExitStack], Collect]
    held_out: bool = False
    check: Callable[[Sequence[Any], Any], None] = lambda specs, env: None


# kind name -> its Demonstrator. The warm start demonstrates the kinds of this registry only (the
# trainer leaves the other kinds' tasks out of it), in its order.
DEMONSTRATORS: dict[str, Demonstrator] = {}


def register_demonstrator(kind: str, demonstrator: Demonstrator) -> Demonstrator:
    """Makes the warm start demonstrate the tasks of the environment kind `kind`."""
    DEMONSTRATORS[kind] = demonstrator
    return demonstrator


def demonstrated_tasks(tasks: Sequence[str], catalog: Any) -> list[str]:
    """The tasks (of the TaskCatalog `catalog`) of a kind the warm start demonstrates, in order."""
    return [task for task in tasks if catalog[task].kind in DEMONSTRATORS]


def check_demonstrations(tasks: Sequence[str], catalog: Any, env: Any) -> None:
    """ValueError "config.<field>: ..." when the warm start cannot demonstrate the training
    `tasks` (of the TaskCatalog `catalog`) with the run's EnvSettings `env`: none of a kind it
    demonstrates, or a kind's own check (`Demonstrator.check`) fails."""
    demonstrated = demonstrated_tasks(tasks, catalog)
    if not demonstrated:
        raise ValueError(
            f"config.warm_start.steps: the warm start demonstrates tasks of the kinds {list(DEMONSTRATORS)}, "
            "and the run trains on none"
        )
    for kind in dict.fromkeys(catalog[task].kind for task in demonstrated):
        DEMONSTRATORS[kind].check([catalog[t].spec for t in demonstrated if catalog[t].kind == kind], env)


def _open_code(settings, segmenter: Segmenter, agent: AgentConfig, stack: contextlib.ExitStack) -> Collect:
    """The code oracle's fixes, each on a code container of its own."""

    def collect(tasks: Sequence[str], seeds: Sequence[int]) -> Demonstrations:
        return collect_code_demonstrations(
            [settings.catalog[task].spec for task in tasks],
            seeds,
            code_env=settings.kind_configs["code"],
            segmenter=segmenter,
            agent_config=agent,
            concurrency=settings.warm_start.concurrency,
        )

    return collect


def _open_miniwob(settings, segmenter: Segmenter, agent: AgentConfig, stack: contextlib.ExitStack) -> Collect:
    """The MiniWoB oracle's episodes on a capsule runtime of the warm start's own, which shows
    the DOM text the oracle reads."""
    runtime = stack.enter_context(
        settings.kind_configs["miniwob"].runtime(
            include_dom_text=True, action_space=settings.env.action_space, seed=settings.seed
        )
    )
    return functools.partial(
        collect_demonstrations,
        runtime=runtime,
        segmenter=segmenter,
        agent_config=agent,
        time_limit_s=settings.env.time_limit_s,
        concurrency=settings.warm_start.concurrency,
    )


def _check_miniwob(specs: Sequence[str], env: Any) -> None:
    """The MiniWoB oracle reads the page's DOM text, and solves the tasks of ORACLE_TASKS."""
    if not env.include_dom_text:
        raise ValueError(
            "config.warm_start.steps: the warm start's oracle reads the page as DOM text: set "
            "env.include_dom_text = True"
        )
    unsolved = [task for task in specs if task not in ORACLE_TASKS]
    if unsolved:
        raise ValueError(
            f"config.warm_start.steps: the oracle has no demonstrations for {unsolved} "
            f"(it solves {sorted(ORACLE_TASKS)})"
        )


# Code first: its demonstrations come first in the fine-tuning data.
register_demonstrator("code", Demonstrator(_open_code))
register_demonstrator("miniwob", Demonstrator(_open_miniwob, held_out=True, check=_check_miniwob))


def warm_start(
    model: nnx.Module,
    tasks: Sequence[str],
    seeds: Sequence[int],
    *,
    runtime,
    segmenter: Segmenter,
    config: WarmStartConfig = WarmStartConfig(),
    agent_config: AgentConfig = AgentConfig(max_turns=15, max_new_tokens=64, max_context_tokens=4096),
    time_limit_s: float | None = 600.0,
    concurrency: int = 4,
    reasoning: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[SupervisedRun, Demonstrations]:
    """Demonstrations of every (task, seed), then `config.steps` of supervised fine-tuning of
    `model` (updated in place) on them; on_step(step, loss) is called after every step.

    agent_config must be the RL run's (its budgets shape the token streams); the segmenter's
    renderer gives the image processor. Returns the finished run and the demonstrations.
    """
    demonstrations = collect_demonstrations(
        tasks,
        seeds,
        runtime=runtime,
        segmenter=segmenter,
        agent_config=agent_config,
        time_limit_s=time_limit_s,
        concurrency=concurrency,
        reasoning=reasoning,
    )
    return fine_tune(model, demonstrations, tasks, segmenter, config, on_step), demonstrations


def run_warm_start(policy, tasks: Sequence[str], settings, segmenter, renderer, workdir: str) -> dict[str, float]:
    """A training run's warm start: supervised fine-tuning of `policy` (in place) on the
    oracle's demonstrations of `tasks` (warm_start.demos_per_task training seeds), collected
    through the run's agent loop and segmenter by each kind's `Demonstrator` (DEMONSTRATORS),
    and scored on held-out seeds of the kinds that ask for it when warm_start.held_out_seeds. Returns the warm start's
    metrics; the loss curve and the record go to <workdir>/warm_start.json."""
    # The demonstrations' budgets are the larger of training's and evaluation's, so a
    # multi-step oracle episode is not cut short; the token stream is the same either way.
    agent = dataclasses.replace(settings.agent, max_turns=max(settings.rollout.max_turns, settings.eval.max_turns))
    progress, on_step = None, None
    if settings.train.progress_bar:
        progress = tqdm(total=settings.warm_start.steps, desc=f"{settings.name} warm start", unit="step")

        def on_step(step: int, loss: float) -> None:
            progress.update(1)
            progress.set_postfix(nll=f"{loss:.3f}")

    start = time.perf_counter()
    held_out = {}
    by_kind = {}  # kind -> its tasks
    for task in tasks:
        by_kind.setdefault(settings.catalog[task].kind, []).append(task)
    kinds = [kind for kind in DEMONSTRATORS if kind in by_kind]  # in the registry's order
    seeds = range(settings.warm_start.demos_per_task)
    try:
        with contextlib.ExitStack() as stack:
            parts, collectors = [], {}
            for kind in kinds:
                collectors[kind] = DEMONSTRATORS[kind].open(settings, segmenter, agent, stack)
                parts.append(collectors[kind](by_kind[kind], seeds))
            demonstrations = Demonstrations.joined(parts)
            run = fine_tune(policy, demonstrations, tasks, segmenter, settings.warm_start, on_step)
            scored = [kind for kind in kinds if DEMONSTRATORS[kind].held_out]
            if scored and settings.warm_start.held_out_seeds:
                # Past the evaluation seeds: outside training's range and unseen by "before".
                first = settings.env.eval_seed_start + settings.eval.num_seeds
                unseen_seeds = range(first, first + settings.warm_start.held_out_seeds)
                unseen = Demonstrations.joined([collectors[kind](by_kind[kind], unseen_seeds) for kind in scored])
                if unseen.rollouts:
                    scorer = HeldOutScorer.build(
                        demonstrations, unseen, renderer, run.data.multimodal, settings.warm_start
                    )
                    held_out = scorer(run.learner)
    finally:
        if progress is not None:
            progress.close()
    wall = time.perf_counter() - start
    record = {
        "losses": run.losses,
        "demonstrations": len(demonstrations.rollouts),
        "items": len(demonstrations.items),
        "response_tokens": demonstrations.num_response_tokens,
        "rejected": demonstrations.rejected,
        "oracle_errors": demonstrations.oracle_errors,
        "sft_seconds": run.seconds,
        "wall_seconds": wall,
        "compiled_shapes": len(run.shapes),
        **held_out,
    }
    with open(os.path.join(workdir, "warm_start.json"), "w") as f:
        json.dump(record, f, indent=2)
    tail = run.losses[-10:]
    return {
        "warm_start/demonstrations": float(len(demonstrations.rollouts)),
        "warm_start/rejected": float(len(demonstrations.rejected)),
        "warm_start/items": float(len(demonstrations.items)),
        "warm_start/loss_first": run.losses[0],
        "warm_start/loss_last10": float(np.mean(tail)),
        **{f"warm_start/{name}": value for name, value in held_out.items()},
        TIMING_PREFIX + "warm_start_s": wall,
    }
