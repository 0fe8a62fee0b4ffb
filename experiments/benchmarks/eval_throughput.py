"""Evaluation throughput: the harness against a sequential loop, episodes per second.

Both sides run the same episodes (TASKS x --seeds seeds x --k samples, the evaluation agent
loop, --turns turns each) on the same rollout worker (one capsule runtime, one engine) in one
process, timed from the first episode's start to the last one's end:

  sequential  one episode at a time: `worker.run_groups([(task, seed, id)], 1)` per sample;
  harness     `cua_jax.eval.harness.evaluate`: the k samples of a (task, seed) as one group
              and --groups-per-call groups per worker call, so the engine batches generation
              across every episode in flight and the capsules run concurrently; it also
              writes its results file and tables, as an evaluation does.

Before timing, each side runs the same workload once on other seeds (compiling the sampler for
its batch shapes, warming the browser). The policy is the tiny random Qwen3-VL (`--policy
tiny`, generation-bound) or the random-action policy (`--policy random`, environment-bound).
With --delay_median_s > 0 every reset and step first sleeps a log-normal delay
(`LatencyWrapper`, the same streams on both sides), as a remote environment's answer does.

    python -m experiments.benchmarks.eval_throughput [--policy tiny] [--k 4] [--seeds 2] [--delay_median_s 0]

The ratio printed is harness / sequential episodes per second: above 1, the harness is faster.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

TASKS = ("click-button", "click-link", "focus-text", "enter-text")


def make_policy(kind: str, turns: int, max_new_tokens: int):
    from cua_jax.train.build import build_policy
    from cua_jax.train.settings import TrainSettings
    from experiments.configs import evaluate
    from experiments.policies import EvalPolicy, load_eval_policy

    config = evaluate.get_config()
    config.eval.max_turns = turns
    config.rollout.max_new_tokens = max_new_tokens
    config.eval.max_context_tokens = 8192
    if kind == "random":
        return load_eval_policy("random", config)
    config.model.name = "tiny_qwen3_vl"
    return EvalPolicy("tiny", config, build_policy(TrainSettings.from_config(config), config.seed))


def run_sequential(worker, seeds, k: int) -> int:
    episodes = 0
    for t, task in enumerate(TASKS):
        for s, seed in enumerate(seeds):
            for sample in range(k):
                worker.run_groups([(task, seed, -(1 + (t * len(seeds) + s) * k + sample))], 1, evaluation=True)
                episodes += 1
    return episodes


def run_harness(worker, policy, suite, seeds, k: int, groups_per_call: int) -> int:
    from cua_jax.eval.harness import evaluate

    with tempfile.TemporaryDirectory() as out:
        summary = evaluate(
            [worker], policy, suite, seeds, k, out, progress=False, groups_per_call=groups_per_call, max_reruns=0
        )  # as the sequential loop: no quarantine reruns
    return summary["overall"]["episodes"] + summary["overall"]["quarantined"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", choices=("tiny", "random"), default="tiny")
    parser.add_argument("--k", type=int, default=4, help="samples per task and seed")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per task")
    parser.add_argument("--turns", type=int, default=3, help="turn budget per episode")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--groups-per-call", type=int, default=8)
    parser.add_argument("--delay_median_s", type=float, default=0.0, help="median injected delay per reset / step")
    parser.add_argument("--delay_sigma", type=float, default=1.0)
    args = parser.parse_args()

    from cua_jax.eval.suites import load_suite
    from cua_jax.observe.logs import quiet_library_logging
    from cua_jax.train.settings import TrainSettings
    from experiments.policies import build_eval_workers

    quiet_library_logging()
    policy = make_policy(args.policy, args.turns, args.max_new_tokens)
    suite = load_suite("miniwob").restricted(TASKS)
    agent = TrainSettings.from_config(policy.config).eval_agent
    wrapper = None
    if args.delay_median_s > 0:
        from cua_jax.rollout.latency import LatencyWrapper

        wrapper = LatencyWrapper(args.delay_median_s, args.delay_sigma, max_s=30.0, seed=0, delay_reset=True)
    workers = build_eval_workers(policy, suite, agent, 1, wrapper, group_size=args.k)
    warm, timed = suite.seeds(2 * args.seeds)[: args.seeds], suite.seeds(2 * args.seeds)[args.seeds :]
    try:
        results = {}
        for name, run in (
            ("sequential", lambda seeds: run_sequential(workers[0], seeds, args.k)),
            ("harness", lambda seeds: run_harness(workers[0], policy, suite, seeds, args.k, args.groups_per_call)),
        ):
            run(warm)
            started = time.perf_counter()
            episodes = run(timed)
            seconds = time.perf_counter() - started
            results[name] = episodes / seconds
            print(f"{name:>10}: {episodes} episodes in {seconds:.1f} s = {results[name]:.2f} episodes/s")
    finally:
        for worker in workers:
            worker.shutdown()
    print(
        f"policy {args.policy}, {len(TASKS)} tasks x {args.seeds} seeds x k={args.k}, {args.turns} turns, "
        f"{args.groups_per_call} groups per call, injected delay median {args.delay_median_s} s, "
        f"{os.cpu_count()} cores"
    )
    print(f"ratio harness / sequential: {results['harness'] / results['sequential']:.2f}x")


if __name__ == "__main__":
    main()
