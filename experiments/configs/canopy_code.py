"""CANOPY's recipe on code tasks at CPU scale: strictly on-policy GRPO on bugs injected into
real Python repositories, judged by the repositories' own tests.

    python -m experiments.main --config=experiments/configs/canopy_code.py

The tasks (env.kind = "code") come from the code suite (cua_jax/tasks/suites/code): one per
package of its six, chosen for their short issue reports. Each episode runs in a
`--network none` container of the code image (a shell and a file editor as the tools, the
system prompt `code_actions.SYSTEM_PROMPT`), ends on `submit` or at the turn budget, and is
rewarded 1 when every test the bug broke passes again and nothing else fails. A memory hog,
a fork bomb or a filled work tree is the agent's own fault (advantage.agent_faults): a failure
scored 0 that stays in its group and is counted (agent_fault/<kind>), not a quarantine. Each rollout
environment keeps one container and resets it to a clean tree per episode
(env.code.reset_mode = "pooled", 4.4x the episodes/s of a fresh container:
experiments/benchmarks/code_env.py).

CANOPY's settings as in experiments/configs/canopy.py (Table A1): one update per rollout
batch with the ratio exactly 1, k3 KL to the frozen base, token-mean loss over action tokens,
sparse {0, 1} reward with the SWE terminal constants (-0.2 for an episode with nothing to
test: no patch, one that does not apply, a crashed test run, the budget run out), GRPO
advantages, no entropy bonus, the whole trajectory as one item.
Scaled for two CPU cores: the tiny text-only Qwen3 (observations are text: the issue,
the shell's output, the editor's views), groups of 8 (paper 32), 2 tasks per step, 8 turns
(paper 50), each observation capped at 512 tokens (paper 4,096) and each stream at 2,000
bytes. The random policy exercises the loop; it does not fix bugs. Set model.name = "qwen3"
and model.init_from to train a Qwen3 checkpoint; `env.code.tasks = ()` trains on all 113.
Held-out evaluation before and after training runs through the evaluation harness: 2 unseen
seeds per task (a code task's instance is its bug: the seed only numbers the sample), with a
raised turn budget of 12 (CANOPY evaluates with more turns than it trains with).
"""

from experiments.configs.base import base_config

# One task per package, each with a short issue report (112-168 tokens of the shipped tokenizer).
CODE_TASKS = (
    "code-inflection-006",
    "code-six-012",
    "code-parse-004",
    "code-toolz-007",
    "code-cachetools-001",
    "code-more-itertools-004",
)


def get_config():
    c = base_config()
    c.name = "canopy_code"
    c.workdir = "runs/canopy_code"
    c.model.name = "tiny_qwen3"  # paper: Qwen3-14B
    c.model.num_layers = 2
    c.env.kind = "code"
    c.env.tasks = ()
    c.env.code.tasks = CODE_TASKS
    c.env.code.reset_mode = "pooled"
    c.env.code.output_limit = 2000
    c.env.observation = "text"
    c.env.drop_hardest_tier = False
    c.rollout.group_size = 8  # n, paper 32
    c.rollout.batch_tasks = 2  # paper 90 tasks per step
    c.rollout.max_turns = 8  # paper 50
    c.rollout.max_new_tokens = 96  # a tool call with a short edit
    c.rollout.max_context_tokens = 4096  # prompt cap 4,096
    c.rollout.max_response_tokens = 0  # paper 32,768 per episode
    c.rollout.max_observation_tokens = 512  # paper 4,096
    c.rollout.temperature = 0.9
    c.learner.num_minibatches = 1  # mini-batch = train batch, one epoch
    c.learner.rows = 4
    c.learner.length_multiple = 256
    c.learner.old_logprobs = "current"  # strictly on-policy
    c.train.mode = "on_policy"
    c.train.staleness_window = 0
    c.train.num_steps = 20
    c.train.checkpoint_every = 10
    c.optimizer.learning_rate = 3e-6
    c.optimizer.schedule = "constant"
    c.optimizer.weight_decay = 0.0
    c.loss.clip_eps_low = 0.2
    c.loss.clip_eps_high = 0.2
    c.loss.dual_clip_c = 0.0
    c.loss.kl_coef = 1e-4
    c.loss.kl_estimator = "k3"
    c.loss.entropy_coef = 0.0
    c.loss.aggregation = "token_mean"
    c.advantage.estimator = "grpo"
    c.advantage.reward = "sparse"  # the paper's choice over the dense "pass_fraction" (App. A2)
    # SWE terminal constants (§4.4, App. H): an episode that leaves nothing to test (no patch,
    # a patch that does not apply, a test run that crashes, the budget run out) scores -0.2,
    # below a wrong patch's 0.
    c.advantage.no_patch_reward = -0.2
    c.advantage.crash_reward = -0.2
    c.advantage.no_verdict_reward = -0.2
    c.advantage.item_advantages = "broadcast"
    c.context.segmenter = "whole_trajectory"
    c.sampler.kind = "uniform"
    c.eval.enabled = True
    c.eval.num_seeds = 2
    c.eval.max_turns = 12
    return c
