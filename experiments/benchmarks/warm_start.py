"""Supervised warm start of a tiny Qwen3-VL policy on the MiniWoB oracle's demonstrations.

Baseline: the random-init policy. Ours: the same policy after `cua_jax.train.warm_start`.
Both are measured side by side on the same held-out seeds, greedy, through the JAX sampler
engine and the agent loop on real capsules: held-out demonstration NLL, its part on the
click-point digits (against a page-blind prior fitted to the demonstrations' clicks: does
the policy read its clicks off the page?), valid-action rate, first-turn valid-action rate
and success rate, and the warm start's wall time.

    python -m experiments.benchmarks.warm_start --tasks=click-button,focus-text --steps=200
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="click-button,focus-text")
    parser.add_argument("--train_seeds", type=int, default=8, help="demonstration seeds per task: 0..n-1")
    parser.add_argument("--eval_seeds", type=int, default=4, help="held-out seeds per task: 1000000..")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--layers", type=int, default=3, help="decoder layers of the tiny Qwen3-VL")
    parser.add_argument("--max_turns", type=int, default=4)
    args = parser.parse_args(argv)

    from flax import nnx

    from cua_jax.context.render import ChatRenderer
    from cua_jax.context.segment import SlidingWindow
    from cua_jax.context.tokenizer import load_processor
    from cua_jax.envs.capsules import CapsuleRuntime
    from cua_jax.eval.in_process import evaluate_model_in_process
    from cua_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, tiny_qwen3_vl_config
    from cua_jax.rollout.agent_loop import AgentConfig
    from cua_jax.train.batching import MultimodalPositions
    from cua_jax.train.demonstrations import collect_demonstrations
    from cua_jax.train.learner import Learner
    from cua_jax.train.sft import DemonstrationData, WarmStartConfig
    from cua_jax.train.warm_start import warm_start
    from cua_jax.train.warm_start_diagnostics import click_point_items, click_point_prior_nll, click_points

    tasks = args.tasks.split(",")
    held_out = range(1_000_000, 1_000_000 + args.eval_seeds)
    tokenizer, image_processor = load_processor()
    segmenter = SlidingWindow(ChatRenderer(tokenizer, image_processor), keep=5, min_removal=5)
    config = WarmStartConfig(steps=args.steps, rows=args.rows, learning_rate=args.learning_rate, length_multiple=64)
    greedy = AgentConfig(max_turns=args.max_turns, max_new_tokens=64, max_context_tokens=4096, temperature=0.0)
    model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config(num_hidden_layers=args.layers), rngs=nnx.Rngs(0))
    with CapsuleRuntime(include_dom_text=True, seed=0) as runtime:
        held = collect_demonstrations(tasks, held_out, runtime=runtime, segmenter=segmenter)
        held_data = DemonstrationData(
            held.items,
            held.episodes,
            image_processor,
            MultimodalPositions.of(model.config),
            config.rows,
            config.length_multiple,
        )
        click_data = DemonstrationData(
            click_point_items(held.items, tokenizer),
            held.episodes,
            image_processor,
            MultimodalPositions.of(model.config),
            config.rows,
            config.length_multiple,
        )

        def measure(label: str, learner: Learner) -> dict[str, float]:
            evaluation = evaluate_model_in_process(
                model, tasks, held_out, runtime=runtime, segmenter=segmenter, agent_config=greedy
            )
            row = {
                "held_out_nll": learner.evaluate(held_data.all_batches())["loss"],
                "held_out_click_nll": learner.evaluate(click_data.all_batches())["loss"],
                **evaluation.summary(),
            }
            print(f"{label:>10}: " + "  ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
            return row

        baseline = measure("random", Learner(model, config.learner()))
        start = time.perf_counter()
        result, demonstrations = warm_start(
            model, tasks, range(args.train_seeds), runtime=runtime, segmenter=segmenter, config=config
        )
        wall = time.perf_counter() - start
        ours = measure("warm", result.learner)
    print(
        f"demonstrations: {len(demonstrations.rollouts)} episodes, {len(demonstrations.items)} items, "
        f"{demonstrations.num_response_tokens} response tokens, rejected {len(demonstrations.rejected)}"
    )
    print(
        f"warm start: {wall:.1f} s wall ({result.seconds:.1f} s SFT, {args.steps} steps, "
        f"{len(result.shapes)} compiled shapes); loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}"
    )
    print(f"held-out NLL ratio warm/random: {ours['held_out_nll'] / baseline['held_out_nll']:.3f}")
    prior = click_point_prior_nll(click_points(demonstrations), click_points(held))
    print(
        f"held-out click-point digits: random {baseline['held_out_click_nll']:.3f} -> warm "
        f"{ours['held_out_click_nll']:.3f} nats each; page-blind prior {prior:.3f} (0 if read off the page)"
    )
    for key in ("valid_action_rate", "first_turn_valid_rate", "success_rate"):
        print(f"{key}: random {baseline[key]:.3f} -> warm {ours[key]:.3f} (delta {ours[key] - baseline[key]:+.3f})")


if __name__ == "__main__":
    main()
