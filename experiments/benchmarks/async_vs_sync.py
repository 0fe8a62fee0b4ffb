"""Asynchronous vs synchronous online RL, like with like, under long-tailed environment latency.

Every mode trains the same run side by side in one process, with the same number of rollout
workers (each a capsule runtime or desktop pool and an engine), every environment wrapped in
`cua_jax.rollout.latency.LatencyWrapper`: a log-normal delay (median --delay_median_s,
log-sigma --delay_sigma, capped at --delay_max_s) before every reset and step, slept without
using CPU, as a remote desktop's is.

  --policy base  experiments/configs/default.py: the shipped base policy on its MiniWoB tasks,
                 so held-out success is above 0 and comparable (the default);
  --policy tiny  experiments/configs/tiny.py: a 2-layer random Qwen3-VL;
  --env desktop  experiments/configs/desktop.py: real Docker desktops (the desktop suite),
                 a random policy of its own (held-out success there is 0).

Modes, one per --staleness value:

  s = 0    train.mode = "on_policy" (synchronous): collect a rollout batch over all workers,
           update once, sync weights, repeat;
  s >= 1   train.mode = "async", staleness_window = s: a rollout thread per worker fills the
           buffer while the learner trains; groups older than s versions are dropped whole
           (counted). Old logprobs are the engine's ("rollout"), or the proximal policy's with
           --surrogate decoupled (AReaL's decoupled objective, `loss.surrogate`);
           --episodes_in_flight N streams the rollouts (`rollout.max_episodes_in_flight`) and
           --partial_tokens N lets weight updates land mid-reply (`rollout.partial_rollout_tokens`).

One update per rollout batch everywhere. Each mode takes --warmup_steps learner steps (they
absorb compilation and the buffer's fill), then --steps timed steps; with --eval_seeds > 0 it
then evaluates on held-out seeds (every mode has trained the same number of episodes). Printed
per mode:

  ep/s          episodes the rollouts finished per second of the timed window (reached the
                learner, trained or dropped, plus the change in the buffer)
  updates/s     optimizer updates per second
  lag           mean policy lag of the trained episodes
  stale         groups dropped as older than the window, during the timed steps
  learner idle  fraction of the window the learner waited for rollouts
  rollout idle  fraction of the workers' time spent not rolling out: synchronous, while the
                learner learns; asynchronous, waiting for room in a full buffer
  held-out      success on held-out seeds after the timed steps, with its Wilson interval

then each asynchronous mode's ratios over the synchronous one, a JSON of everything and a PNG
under --out.

    python -m experiments.benchmarks.async_vs_sync [--policy base] [--workers 1] [--staleness 0 1 2 4]
        [--steps 6] [--delay_median_s 1.5] [--delay_sigma 1.0] [--eval_seeds 8]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

from cua_jax.observe.metrics import TIMING_PREFIX
from cua_jax.rollout.latency import LatencyWrapper
from cua_jax.train.trainer import Trainer, build_trainer, prepare_run, warm_start
from experiments.configs import tiny


def bench_config(
    workdir: str,
    *,
    policy: str,
    env: str,
    staleness: int,
    workers: int,
    buffer_groups: int = 0,
    surrogate: str = "ppo",
    eval_seeds: int = 0,
    episodes_in_flight: int = 0,
    partial_tokens: int = 0,
):
    """The run of --policy / --env in `workdir`: synchronous at staleness 0, else asynchronous
    with that staleness window; `workers` rollout workers either way."""
    from experiments.configs import default, desktop

    c = {"base": default, "tiny": tiny}[policy].get_config() if env == "miniwob" else desktop.get_config()
    c.name = "async_vs_sync"
    c.workdir = workdir
    c.train.progress_bar = False
    c.rollout.num_workers = workers
    c.eval.enabled = eval_seeds > 0
    c.eval.num_seeds = max(eval_seeds, 1)
    if staleness > 0:
        c.train.mode = "async"
        c.train.staleness_window = staleness
        c.learner.old_logprobs = "recompute" if surrogate == "decoupled" else "rollout"
        c.loss.surrogate = surrogate
        c.train.buffer_groups = buffer_groups
        c.rollout.max_episodes_in_flight = episodes_in_flight
        c.rollout.partial_rollout_tokens = partial_tokens
    return c


def _buffered_episodes(trainer: Trainer) -> int:
    buffer = trainer.buffer
    return 0 if buffer is None else len(buffer) * trainer.settings.rollout.group_size


def measure(label: str, config, latency: LatencyWrapper, warmup_steps: int, steps: int) -> dict:
    """Warm-up steps, then `steps` timed learner steps of one mode, then (eval.enabled) its
    held-out evaluation; its row."""
    asynchronous = config.train.mode == "async"
    setup_start = time.perf_counter()
    setup = prepare_run(config)
    warm_start(setup)
    with build_trainer(setup, env_wrapper=latency) as trainer:
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
            blocked_before = trainer.feeder.blocked_s if asynchronous else 0.0
            start = time.perf_counter()
            timed = [step() for _ in range(steps)]
            wall_s = time.perf_counter() - start
            buffered_after = _buffered_episodes(trainer)
            dropped_groups = trainer.buffer.dropped_stale_groups - dropped_before if asynchronous else 0
            dropped_episodes = trainer.buffer.dropped_stale_episodes - dropped_episodes_before if asynchronous else 0
            blocked_s = trainer.feeder.blocked_s - blocked_before if asynchronous else 0.0
        finally:
            if asynchronous:
                trainer.stop_rollouts()
        held_out = trainer.evaluate("after") if config.eval.enabled else None
    trained = sum(m.get("episodes/total", 0.0) for m in timed)
    finished = trained + dropped_episodes + (buffered_after - buffered_before)
    waited = sum(m.get(TIMING_PREFIX + ("rollout_wait_s" if asynchronous else "rollout_s"), 0.0) for m in timed)
    learn_s = sum(m.get(TIMING_PREFIX + "learn_s", 0.0) + m.get(TIMING_PREFIX + "sync_s", 0.0) for m in timed)
    workers = int(config.rollout.num_workers)
    row = {
        "label": label,
        "mode": config.train.mode,
        "staleness": int(config.train.staleness_window) if asynchronous else 0,
        "workers": workers,
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
        # Synchronous: the workers wait while the learner learns; asynchronous: while the buffer is full.
        "rollout_idle_fraction": (learn_s / wall_s) if not asynchronous else blocked_s / (wall_s * workers),
        "learn_s_mean": sum(m.get(TIMING_PREFIX + "learn_s", 0.0) for m in timed) / steps,
        "held_out": None
        if held_out is None
        else {k: held_out[k] for k in ("success_rate", "ci_low", "ci_high", "episodes")},
    }
    print(
        f"  {label}: {steps} steps in {wall_s:.1f} s (setup + {warmup_steps} warm-up steps {setup_s:.1f} s)", flush=True
    )
    return row


def plot_rows(rows: list[dict], path: str) -> str:
    """Bars of updates/s and episodes/s per mode, and the idle fractions, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key, title in ((axes[0], "updates_per_s", "updates / s"), (axes[1], "episodes_per_s", "episodes / s")):
        ax.bar(labels, [r[key] for r in rows], color=["#888"] + ["#3a7"] * (len(rows) - 1))
        ax.set_title(title)
    x = range(len(rows))
    axes[2].bar([i - 0.2 for i in x], [r["learner_idle_fraction"] for r in rows], width=0.4, label="learner idle")
    axes[2].bar([i + 0.2 for i in x], [r["rollout_idle_fraction"] for r in rows], width=0.4, label="rollout idle")
    axes[2].set_xticks(list(x), labels)
    axes[2].set_ylim(0, 1)
    axes[2].legend()
    axes[2].set_title("idle fraction")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=("base", "tiny"), default="base", help="MiniWoB runs' policy")
    parser.add_argument("--env", choices=("miniwob", "desktop"), default="miniwob")
    parser.add_argument(
        "--staleness",
        type=int,
        nargs="+",
        default=[0, 1, 2, 4],
        help="one mode per value; 0 is the synchronous run every ratio divides by",
    )
    parser.add_argument("--workers", type=int, default=1, help="rollout workers of every mode")
    parser.add_argument("--surrogate", choices=("ppo", "decoupled"), default="ppo", help="asynchronous modes' loss")
    parser.add_argument(
        "--episodes_in_flight",
        type=int,
        default=0,
        help="asynchronous modes: stream up to this many episodes per worker (0: draw at a time)",
    )
    parser.add_argument(
        "--partial_tokens",
        type=int,
        default=0,
        help="asynchronous modes: partial rollouts, replies grown this many tokens at a time (0: off)",
    )
    parser.add_argument("--steps", type=int, default=6, help="timed learner steps per mode")
    parser.add_argument("--warmup_steps", type=int, default=2, help="untimed learner steps first (compilation)")
    parser.add_argument("--eval_seeds", type=int, default=0, help="held-out seeds per task after the timed steps")
    parser.add_argument("--delay_median_s", type=float, default=1.5, help="median injected delay per reset / step")
    parser.add_argument(
        "--delay_sigma", type=float, default=1.0, help="log-normal sigma (p99 = median x e^(2.33 sigma))"
    )
    parser.add_argument("--delay_max_s", type=float, default=30.0, help="cap of one injected delay")
    parser.add_argument("--buffer_groups", type=int, default=0, help="async buffer capacity (0: 2 x tasks per step)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the delay streams")
    parser.add_argument("--out", default="runs/benchmarks/async_vs_sync")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 1:
        parser.error("--steps and --warmup_steps must be >= 1 (the first step compiles)")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if 0 not in args.staleness or any(s < 0 for s in args.staleness):
        parser.error(f"--staleness needs 0 (the synchronous run) and values >= 0, got {args.staleness}")

    def latency() -> LatencyWrapper:  # every mode draws the same delay streams
        return LatencyWrapper(
            args.delay_median_s, args.delay_sigma, max_s=args.delay_max_s, seed=args.seed, delay_reset=True
        )

    quantiles = latency().distribution.quantile([0.5, 0.9, 0.99])
    print(
        f"injected latency per reset and step: log-normal, median {quantiles[0]:.2f} s, p90 {quantiles[1]:.2f} s, "
        f"p99 {quantiles[2]:.2f} s, cap {args.delay_max_s:.0f} s; {args.warmup_steps} warm-up + {args.steps} timed "
        f"steps per mode; {args.workers} rollout workers each; policy {args.policy}, env {args.env}",
        flush=True,
    )
    started = time.perf_counter()
    rows = []
    for staleness in sorted(set(args.staleness)):
        label = "sync" if staleness == 0 else f"async/s{staleness}"
        config = bench_config(
            os.path.join(args.out, label.replace("/", "_")),
            policy=args.policy,
            env=args.env,
            staleness=staleness,
            workers=args.workers,
            buffer_groups=args.buffer_groups,
            surrogate=args.surrogate,
            eval_seeds=args.eval_seeds,
            episodes_in_flight=args.episodes_in_flight,
            partial_tokens=args.partial_tokens,
        )
        rows.append(measure(label, config, latency(), args.warmup_steps, args.steps))

    header = (
        f"{'mode':<10}{'wall s':>8}{'ep/s':>8}{'updates/s':>10}{'lag':>6}{'stale':>6}{'learner':>8}"
        f"{'rollout':>8}{'learn s':>8}  held-out"
    )
    print(
        "\n"
        + header
        + "\n"
        + f"{'':<10}{'':>8}{'':>8}{'':>10}{'':>6}{'':>6}{'idle':>8}{'idle':>8}\n"
        + "-" * len(header)
    )
    for r in rows:
        held = r["held_out"]
        held_text = "-" if held is None else f"{held['success_rate']:.3f} [{held['ci_low']:.3f}, {held['ci_high']:.3f}]"
        print(
            f"{r['label']:<10}{r['wall_s']:>8.1f}{r['episodes_per_s']:>8.3f}{r['updates_per_s']:>10.3f}"
            f"{r['policy_lag_mean']:>6.2f}{r['stale_groups_dropped']:>6.0f}{r['learner_idle_fraction']:>8.2f}"
            f"{r['rollout_idle_fraction']:>8.2f}{r['learn_s_mean']:>8.2f}  {held_text}"
        )
    sync = rows[0]
    ratios = {}
    for r in rows[1:]:
        ratios[r["label"]] = {key: r[key] / sync[key] for key in ("episodes_per_s", "updates_per_s")}
        print(
            f"{r['label']}/sync: updates/s {ratios[r['label']]['updates_per_s']:.2f}x, "
            f"episodes/s {ratios[r['label']]['episodes_per_s']:.2f}x"
        )

    os.makedirs(args.out, exist_ok=True)
    path = os.path.abspath(os.path.join(args.out, "results.json"))
    with open(path, "w") as f:
        json.dump(
            {
                "args": vars(args),
                "latency": repr(latency()),
                "rows": rows,
                "ratios": ratios,
                "finished_at": datetime.datetime.now(datetime.UTC).isoformat(),
                "total_s": time.perf_counter() - started,
            },
            f,
            indent=2,
        )
    print(
        f"results: {path}\nplot: {plot_rows(rows, os.path.join(args.out, 'async_vs_sync.png'))}\n"
        f"total wall time {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
