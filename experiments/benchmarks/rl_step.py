"""Where one RL update's wall time goes, with the throughput optimisations off and on.

The reference configuration is the main job's as it stood before the throughput work (the
shipped Qwen3-VL base, 3x128 text layers; click-button / click-widget / click-tab in the
`elements` action space; screenshots through the vision tower; 3 groups x 8 episodes a step,
two turns; strictly on-policy GRPO with k3 KL to the frozen base, one update per step). The
two runs differ only in the throughput fields:

  off  rollout.share_prompts = False, rollout.prefix_cache_tokens = 0,
       rollout.shared_prefix_attention = False, learner.share_prefix = False,
       env.capsules.episodes_per_page = 1
  on   rollout.share_prompts = True (a group's first prompt prefilled once, its screenshot encoded
       once), rollout.prefix_cache_tokens (each episode's keys and values kept between turns),
       rollout.shared_prefix_attention (a group's rows decode over its prompt's keys and values
       held once),
       learner.share_prefix = True (a group's prompt run once by the learner and the reference),
       env.capsules.episodes_per_page as the base config has it (a reset of the same task
       begins in the capsule's page instead of loading a new one)

Each takes --warmup_steps updates (compilation), then --steps timed updates with the same
task draws and seeds, on real MiniWoB++ capsules in this process. The stages of each update
are recorded on a `cua_jax.observe.timeline.Timeline` and its wall time is partitioned among
them (an instant goes to the first stage active then, in this order):

  compile                                XLA compiling a program for a shape not seen before
  vision / prefill / decode              the JAX sampler's device work (images, prompts, replies)
  forward_backward / reference /         the learner's device work: the policy-gradient pass,
  old_logprobs / optimizer               the frozen reference's logprobs, recomputed old
                                         logprobs, the AdamW step
  sync                                   weight sync to the engine
  engine_host                            the engine's Python: requests, images, cache bookkeeping
  learner_host                           advantages, image processing, batching
  agent_host                             the agent loop's Python: rendering, tokenizing, parsing
  env                                    environment reset, step and screenshot (not overlapped)
  other                                  nothing recorded (event-loop waits, thread hand-offs)

Printed: the table (seconds per update by stage, and the tokens each stage processed per
update), episodes/s, seconds per update, the learner's tokens per update against the ideal for
the on run's batches (each group's common prefix counted once), the prefix cache's hit rate,
then the ratios, one per line:

  update wall time off/on: 2.96x
  learner tokens off/on: 3.55x

and a JSON under --out.

  python -m experiments.benchmarks.rl_step [--steps 3] [--warmup_steps 4] [--modes off on] [--warm_pages N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import tempfile
import time

import numpy as np

from cua_jax.observe.timeline import STAGES, Timeline, record_compilation, recording
from cua_jax.train.batching import group_order
from cua_jax.train.trainer import build_trainer, prepare_run, warm_start
from experiments.configs.base import at_tier, base_config

MODES = ("off", "on")
BASE = "experiments/bases/miniwob-elements"


def reference_config(workdir: str, optimizations: bool, warm_pages: int | None = None):
    """The main job's config before the throughput work, with the throughput fields set
    (`warm_pages`: env.capsules.warm_pages for both modes; None keeps the base config's)."""
    c = base_config()
    if warm_pages is not None:
        c.env.capsules.warm_pages = warm_pages
    c.name = "rl_step_" + ("on" if optimizations else "off")
    c.workdir = workdir
    c.model.name = "qwen3_vl"
    c.model.init_from = BASE
    c.env.action_space = "elements"
    c.env.tasks = at_tier(("click-button", "click-widget", "click-tab"))
    c.env.include_dom_text = True
    c.rollout.group_size = 8
    c.rollout.batch_tasks = 3
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens = 128
    c.rollout.max_context_tokens = 4096
    c.rollout.temperature = 1.0
    c.rollout.prompt_style = "compact"
    c.train.mode = "on_policy"
    c.learner.old_logprobs = "current"
    c.learner.num_minibatches = 1
    c.learner.rows = 8
    c.loss.clip_eps_low = c.loss.clip_eps_high = 0.2
    c.loss.dual_clip_c = 0.0
    c.loss.kl_coef = 1e-4
    c.loss.entropy_coef = 0.0
    c.loss.aggregation = "seq_mean_token_mean"
    c.learner.freeze_vision = True
    c.optimizer.learning_rate = 1e-4
    c.context.segmenter = "sliding_window"
    c.context.sliding_window.keep = 2
    c.context.sliding_window.min_removal = 1
    c.eval.enabled = False
    c.train.progress_bar = False
    c.train.checkpoint_every = 10_000
    c.rollout.share_prompts = optimizations
    c.rollout.prefix_cache_tokens = 65536 if optimizations else 0
    c.rollout.shared_prefix_attention = optimizations
    c.learner.share_prefix = optimizations
    if not optimizations:
        c.env.capsules.episodes_per_page = 1
    return c


def ideal_tokens(items) -> int:
    """Tokens of one forward pass over `items` with each group's common token prefix counted once."""
    total = 0
    for members in group_order(items):
        ids = [np.asarray(items[i].ids) for i in members]
        n = min(len(x) for x in ids)
        common = n
        for x in ids[1:]:
            differs = np.flatnonzero(x[:n] != ids[0][:n])
            common = min(common, int(differs[0]) if len(differs) else n)
        total += sum(len(x) for x in ids) - (len(ids) - 1) * common
    return total


def measure(mode: str, args) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        setup = prepare_run(reference_config(workdir, mode == "on", args.warm_pages))
        warm_start(setup)
        with build_trainer(setup) as trainer:
            for _ in range(args.warmup_steps):
                trainer.train_step()
            engine = trainer.workers[0].engine.engine  # the JaxSamplerEngine behind the canonical order
            stats_before = engine.stats()
            timeline = Timeline()
            steps, ideal = [], []
            with recording(timeline):
                for _ in range(args.steps):
                    steps.append(trainer.train_step())
                    ideal.append(ideal_tokens(trainer.last_batch.items))
            stats = {k: v - stats_before.get(k, 0) for k, v in engine.stats().items()}
    n = len(steps)
    windows = {name: [(a, b) for w, a, b in timeline.windows if w == name] for name in ("rollout", "learn")}
    stages = dict.fromkeys(list(STAGES) + ["other"], 0.0)
    for _name, spans in windows.items():
        for a, b in spans:
            for stage, seconds in timeline.breakdown(a, b).items():
                stages[stage] += seconds / n
    rollout_s = sum(b - a for a, b in windows["rollout"]) / n
    learn_s = sum(b - a for a, b in windows["learn"]) / n
    counters = {k: v / n for k, v in timeline.counters.items()}
    episodes = sum(m["episodes/total"] for m in steps) / n
    return {
        "stages_s": stages,
        "rollout_s": rollout_s,
        "learn_s": learn_s,
        "update_s": rollout_s + learn_s,
        "episodes_per_s": episodes / rollout_s,
        "episodes": episodes,
        "counters": counters,
        "learner_tokens": counters.get("learner/forward_backward_tokens", 0.0),
        "reference_tokens": counters.get("learner/reference_tokens", 0.0),
        "ideal_tokens": float(np.mean(ideal)),
        "cache_hit_rate": stats.get("cached_tokens", 0) / max(stats.get("prompt_tokens", 1), 1),
        "engine_stats": stats,
        "success": float(np.mean([m["success/rate"] for m in steps])),
        # Per update: pages begun on (cold, warm) and episodes restarted in a used page.
        "capsules": {k: float(np.mean([m.get(k, 0.0) for m in steps])) for k in steps[0] if k.startswith("capsules/")},
    }


# The tokens each stage processed, from the timeline's counters (per update).
STAGE_TOKENS = {
    "vision": ("sampler/images_encoded", "images"),
    "prefill": ("sampler/prefill_tokens", "tokens"),
    "decode": ("sampler/generated_tokens", "tokens"),
    "forward_backward": ("learner/forward_backward_tokens", "tokens"),
    "reference": ("learner/reference_tokens", "tokens"),
    "old_logprobs": ("learner/old_logprobs_tokens", "tokens"),
}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


def table(results: dict) -> str:
    modes = list(results)
    head = f"{'stage':18s}" + "".join(f"{m + ' s/update':>16s}{m + ' work':>18s}" for m in modes)
    lines = [head, "-" * len(head)]
    for stage in list(STAGES) + ["other"]:
        row = f"{stage:18s}"
        for m in modes:
            r = results[m]
            counter, unit = STAGE_TOKENS.get(stage, (None, ""))
            work = f"{r['counters'].get(counter, 0.0):.0f} {unit}" if counter else ""
            row += f"{r['stages_s'][stage]:16.2f}{work:>18s}"
        lines.append(row)
    lines.append("-" * len(head))
    for label, key in (("rollout", "rollout_s"), ("learn", "learn_s"), ("update", "update_s")):
        lines.append(f"{label:18s}" + "".join(f"{results[m][key]:16.2f}{'':>18s}" for m in modes))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup_steps", type=int, default=4)  # until most shapes are compiled
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--warm_pages", type=int, default=None, help="env.capsules.warm_pages in both modes (default: the base's)"
    )
    parser.add_argument("--out", default="runs/benchmarks")
    args = parser.parse_args()
    record_compilation()
    results = {}
    started = time.time()
    for mode in args.modes:
        results[mode] = measure(mode, args)
        r = results[mode]
        print(
            f"{mode}: {r['update_s']:.2f} s/update (rollout {r['rollout_s']:.2f}, learn {r['learn_s']:.2f}), "
            f"{r['episodes_per_s']:.2f} episodes/s, learner {r['learner_tokens']:.0f} tokens/update "
            f"(ideal {r['ideal_tokens']:.0f}), prefix-cache hits {r['cache_hit_rate']:.1%} of prompt tokens, "
            f"success {r['success']:.2f}; pages per update: "
            + ", ".join(
                f"{k.removeprefix('capsules/')} {v:.1f}"
                for k, v in r["capsules"].items()
                if "builds" in k or "restarts" in k
            ),
            flush=True,
        )
    print(
        f"\nrl_step on {cpu_model()}, {args.steps} timed updates per mode after {args.warmup_steps} warm-up, "
        f"{len(results) and results[args.modes[0]]['episodes']:.0f} episodes each"
    )
    print(table(results))
    if set(MODES) <= set(results):
        off, on = results["off"], results["on"]
        print(f"learner tokens on / ideal: {on['learner_tokens'] / on['ideal_tokens']:.3f}")
        ratios = {
            "update_wall_time": off["update_s"] / on["update_s"],
            "learner_tokens": off["learner_tokens"] / on["learner_tokens"],
        }
        results["ratios_off_over_on"] = ratios
        print(f"update wall time off/on: {ratios['update_wall_time']:.2f}x")
        print(f"learner tokens off/on: {ratios['learner_tokens']:.2f}x")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rl_step_{datetime.datetime.now():%Y%m%d_%H%M%S}.json")
    with open(path, "w") as f:
        json.dump(
            {"args": vars(args), "cpu": cpu_model(), "wall_s": time.time() - started, "results": results}, f, indent=2
        )
    print(path)


if __name__ == "__main__":
    main()
