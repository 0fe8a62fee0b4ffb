"""A text-only web agent on vLLM: a Qwen3 policy that reads MiniWoB++ pages as DOM text.

The policy is a text-only Qwen3ForCausalLM: by default the tiny random init with the shipped
tokenizer (it runs on two CPU cores; it does not learn in a few steps), or any Qwen3
checkpoint in transformers format with `--config.model.name=qwen3
--config.model.init_from=/path/to/Qwen3-...` (its tokenizer and chat template come from
that directory). Observations are the page's interactive elements as text
(env.observation = "text"; no screenshot), actions refer to them by id (`elements`).
Rollouts come from a vLLM engine in a Ray actor (rollout.engine = "vllm"), synced after
every strictly on-policy update; the learner reports its logprob gap to the engine
(learner/rollout_logprob_gap, _p99, _max).

    python -m experiments.main --config=experiments/configs/text_vllm.py
"""

from experiments.configs.base import at_tier, base_config


def get_config():
    c = base_config()
    c.name = "text_vllm"
    c.workdir = "runs/text_vllm"
    c.model.name = "tiny_qwen3"
    c.env.observation = "text"
    c.env.include_dom_text = True
    c.env.action_space = "elements"
    c.env.tasks = at_tier(("click-button", "click-tab", "focus-text"))
    c.rollout.engine = "vllm"
    c.rollout.group_size = 8
    c.rollout.batch_tasks = 2
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens = 48
    c.rollout.max_context_tokens = 2048
    c.rollout.prompt_style = "compact"
    c.rollout.vllm.threads = 2
    c.train.mode = "on_policy"
    c.learner.old_logprobs = "current"
    c.loss.clip_eps_high = 0.2
    c.loss.dual_clip_c = 0.0
    c.loss.tis_cap = 2.0  # truncated importance sampling against the engine's logprobs
    c.optimizer.learning_rate = 1e-4
    c.learner.rows = 8
    c.context.sliding_window.keep = 2
    c.context.sliding_window.min_removal = 1
    c.train.num_steps = 4
    c.eval.num_seeds = 4
    c.eval.max_turns = 2
    c.eval.max_context_tokens = 2048
    return c
