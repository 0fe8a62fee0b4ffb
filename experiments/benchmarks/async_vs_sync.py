"""Asynchronous (staleness 1) vs synchronous online RL under long-tailed environment latency.

The same tiny run (a 2-layer random Qwen3-VL on real MiniWoB++ capsules, click-button and
focus-text, groups of 2, two tasks per step, one turn, no DOM text) trains side by side in
one process, every environment wrapped in `cua_jax.rollout.latency.LatencyWrapper`: a
log-normal delay (median --delay_median_s, log-sigma --delay_sigma, capped at --delay_max_s)
before every reset and every step, slept without using CPU, as a remote desktop's is.

  sync     train.mode = "on_policy", learner.old_logprobs = "current": collect a rollout
           batch, update once, sync weights, repeat (the learner idles while the slowest
           episode of the batch finishes; the environments idle while it learns).
  async/wN train.mode = "async", staleness_window = 1, old_logprobs = "rollout" (the
           engine's own logprobs, so no extra forward pass: the same learner cost as sync),
           N rollout workers (each a capsule runtime and an engine) filling the buffer
           while the learner trains; one update per rollout batch in both modes.

Each mode first takes --warmup_steps learner steps (they absorb compilation and, in async
mode, the buffer's start-up fill), then --steps timed steps. Printed per mode:

  ep/s        episodes the rollouts finished per second of the timed window: those that
              reached the learner (trained or dropped as stale) plus the change in episodes
              waiting in the buffer
  trained/s   episodes trained on per second
  updates/s   optimizer updates per second
  lag         mean policy lag of the trained episodes (learner version - sampling version)
  stale       groups the buffer dropped as older than the window, during the timed steps
  idle        fraction of the window the learner waited for rollouts
  learn s     mean seconds of one learner step (update + weight sync): in async mode it
              shares the CPU with the engines' generation

then the async/sync ratios of ep/s and updates/s, and a JSON of everything under --out.

  python -m experiments.benchmarks.async_vs_sync [--steps 6] [--workers 1 2]
      [--delay_median_s 1.5] [--delay_sigma 1.0]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

from cua_jax.rollout.latency import LatencyWrapper
from cua_jax.observe.metrics import TIMING_PREFIX
from cua_jax.train.trainer import Trainer
from experiments.configs import tiny


def tiny_config(workdir: str, *, asynchronous: bool, workers: int, buffer_groups: int = 0):
    """experiments/configs/tiny.py, on-policy or asynchronous with staleness window 1."""
    c = tiny.get_config()
    c.name = "async_vs_sync"
    c.workdir = workdir
    if asynchronous:
        c.train.mode = "async"
        c.train.staleness_window = 1
        c.learner.old_logprobs = "rollout"
        c.rollout.num_workers = workers
        c.train.buffer_groups = buffer_groups
    return c


def _buffered_episodes(trainer: Trainer) -> int:
    buffer = trainer.buffer
    return 0 if buffer is None else len(buffer) * trainer.config.rollout.group_size


def measure(label: str, config, latency: LatencyWrapper, warmup_steps: int, steps: int) -> dict:
    """Warm-up steps, then `steps` timed learner steps of one mode; its throughput row."""
    asynchronous = config.train.mode == "async"
    setup_start = time.perf_counter()
    with Trainer(config, env_wrapper=latency) as trainer:
        step = trainer.async_step if asynchronous else trainer.train_step
        if asynchronous:
            trainer.start_rollouts()
        try:
            for _ in range(warmup_steps):
                step()
            setup_s = time.perf_counter() - setup_start
            buffered_before = _buffered_episodes(trainer)
            dropped_before = trainer.buffer.dropped_stale_groups if asynchronous else 0
            dropped_episodes_before = trainer.buffer.dropped_stale_episodes if asynchronous else 0
            start = time.perf_counter()
            timed = [step() for _ in range(steps)]
            wall_s = time.perf_counter() - start
            buffered_after = _buffered_episodes(trainer)
            dropped_groups = trainer.buffer.dropped_stale_groups - dropped_before if asynchronous else 0
            dropped_episodes = trainer.buffer.dropped_stale_episodes - dropped_episodes_before if asynchronous else 0
        finally:
            if asynchronous:
                trainer.stop_rollouts()
    trained = sum(m.get("episodes/total", 0.0) for m in timed)
    finished = trained + dropped_episodes + (buffered_after - buffered_before)
    waited = sum(m.get(TIMING_PREFIX + ("rollout_wait_s" if asynchronous else "rollout_s"), 0.0) for m in timed)
    row = {
        "label": label,
        "mode": config.train.mode,
        "workers": int(config.rollout.num_workers) if asynchronous else 1,
        "setup_s": setup_s,
        "wall_s": wall_s,
        "steps": steps,
        "updates": sum(m.get("learner/updates", 0.0) for m in timed),
        "episodes_finished": finished,
        "episodes_trained": trained,
        "episodes_per_s": finished / wall_s,
        "trained_episodes_per_s": trained / wall_s,
        "updates_per_s": sum(m.get("learner/updates", 0.0) for m in timed) / wall_s,
        "policy_lag_mean": sum(m.get("policy/lag_mean", 0.0) for m in timed) / steps,
        "policy_lag_max": max(m.get("policy/lag_max", 0.0) for m in timed),
        "stale_groups_dropped": dropped_groups,
        "learner_idle_fraction": waited / wall_s,
        "learn_s_mean": sum(m.get(TIMING_PREFIX + "learn_s", 0.0) for m in timed) / steps,
    }
    print(f"  {label}: {steps} steps in {wall_s:.1f} s (setup + {warmup_steps} warm-up steps {setup_s:.1f} s)",
          flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed learner steps per mode")
    parser.add_argument("--warmup_steps", type=int, default=2, help="untimed learner steps first (compilation)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="rollout workers of each async run")
    parser.add_argument("--delay_median_s", type=float, default=1.5, help="median injected delay per reset / step")
    parser.add_argument("--delay_sigma", type=float, default=1.0, help="log-normal sigma (p99 = median x e^(2.33 sigma))")
    parser.add_argument("--delay_max_s", type=float, default=30.0, help="cap of one injected delay")
    parser.add_argument("--buffer_groups", type=int, default=0, help="async buffer capacity (0: 2 x tasks per step)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the delay streams")
    parser.add_argument("--out", default="runs/benchmarks/async_vs_sync")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 1:
        parser.error("--steps and --warmup_steps must be >= 1 (the first step compiles)")
    if any(w < 1 for w in args.workers):
        parser.error(f"--workers must be >= 1, got {args.workers}")

    def latency() -> LatencyWrapper:  # every mode draws the same delay streams
        return LatencyWrapper(args.delay_median_s, args.delay_sigma, max_s=args.delay_max_s, seed=args.seed,
                              delay_reset=True)

    quantiles = latency().distribution.quantile([0.5, 0.9, 0.99])
    print(f"injected latency per reset and step: log-normal, median {quantiles[0]:.2f} s, p90 {quantiles[1]:.2f} s, "
          f"p99 {quantiles[2]:.2f} s, cap {args.delay_max_s:.0f} s; {args.warmup_steps} warm-up + {args.steps} timed "
          f"steps per mode", flush=True)
    started = time.perf_counter()
    rows = [measure("sync", tiny_config(os.path.join(args.out, "sync"), asynchronous=False, workers=1), latency(),
                    args.warmup_steps, args.steps)]
    for workers in args.workers:
        label = f"async/w{workers}"
        config = tiny_config(os.path.join(args.out, f"async_w{workers}"), asynchronous=True, workers=workers,
                             buffer_groups=args.buffer_groups)
        rows.append(measure(label, config, latency(), args.warmup_steps, args.steps))

    header = (f"{'mode':<10}{'workers':>8}{'wall s':>8}{'ep/s':>8}{'trained/s':>10}{'updates/s':>10}{'lag':>6}"
              f"{'stale':>6}{'idle':>6}{'learn s':>8}")
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        print(f"{r['label']:<10}{r['workers']:>8}{r['wall_s']:>8.1f}{r['episodes_per_s']:>8.3f}"
              f"{r['trained_episodes_per_s']:>10.3f}{r['updates_per_s']:>10.3f}{r['policy_lag_mean']:>6.2f}"
              f"{r['stale_groups_dropped']:>6.0f}{r['learner_idle_fraction']:>6.2f}{r['learn_s_mean']:>8.2f}")
    sync = rows[0]
    ratios = {}
    for r in rows[1:]:
        ratios[r["label"]] = {key: r[key] / sync[key]
                              for key in ("episodes_per_s", "trained_episodes_per_s", "updates_per_s")}
        print(f"{r['label']}/sync episodes/s: {ratios[r['label']]['episodes_per_s']:.2f}x "
              f"(trained episodes/s: {ratios[r['label']]['trained_episodes_per_s']:.2f}x)")
        print(f"{r['label']}/sync updates/s: {ratios[r['label']]['updates_per_s']:.2f}x")

    os.makedirs(args.out, exist_ok=True)
    path = os.path.abspath(os.path.join(args.out, "results.json"))
    with open(path, "w") as f:
        json.dump({"args": vars(args), "latency": repr(latency()), "rows": rows, "ratios": ratios,
                   "finished_at": datetime.datetime.now(datetime.UTC).isoformat(),
                   "total_s": time.perf_counter() - started}, f, indent=2)
    print(f"results: {path}\ntotal wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
