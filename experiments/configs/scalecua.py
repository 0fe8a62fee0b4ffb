"""ScaleCUA's RL stage (Table 10, App. D): GRPO with asymmetric and dual clipping, Frontier
Sampling, and sliding-window Visual Context Segmentation.

    python -m experiments.main --config=experiments/configs/scalecua.py

Every entry of Table 10 is a field here, at the paper's value (a CPU run overrides the scale,
e.g. --config.rollout.batch_tasks=2 --config.rollout.max_turns=5). The ViT is frozen; the
importance ratio is against the rollout policy's logprobs (eq. 3).
"""

from experiments.configs.base import at_tier, base_config

# 32 tasks per iteration need a pool of at least 32 (a batch draws distinct tasks): MiniWoB++
# tasks of clicking, typing, menus, widgets and forms, all tier 0 (Frontier Sampling adapts).
SCALECUA_TASKS = (
    "click-button",
    "click-button-sequence",
    "click-checkboxes",
    "click-checkboxes-soft",
    "click-collapsible",
    "click-collapsible-2",
    "click-color",
    "click-dialog",
    "click-dialog-2",
    "click-link",
    "click-menu",
    "click-option",
    "click-scroll-list",
    "click-shades",
    "click-shape",
    "click-tab",
    "click-tab-2",
    "click-test",
    "click-test-2",
    "click-widget",
    "enter-date",
    "enter-password",
    "enter-text",
    "enter-text-2",
    "enter-time",
    "focus-text",
    "focus-text-2",
    "identify-shape",
    "login-user",
    "navigate-tree",
    "use-autocomplete",
    "use-slider",
)


def get_config():
    c = base_config()
    c.name = "scalecua"
    c.workdir = "runs/scalecua"
    c.advantage.estimator = "grpo"  # algorithm
    c.optimizer.learning_rate = 3e-6
    c.optimizer.schedule = "constant"
    c.optimizer.weight_decay = 0.0  # no weight decay
    c.loss.clip_eps_low = 0.2  # clip ratio (low / high)
    c.loss.clip_eps_high = 0.28
    c.loss.dual_clip_c = 3.0  # clip ratio cap c
    c.loss.kl_coef = 1e-4  # KL penalty lambda
    c.loss.kl_estimator = "k3"
    c.loss.entropy_coef = 0.0
    c.loss.aggregation = "token_mean"
    c.env.tasks = at_tier(SCALECUA_TASKS)
    c.rollout.batch_tasks = 32  # tasks per iteration (16 for ablations)
    c.rollout.group_size = 8  # rollouts per task n
    c.train.num_steps = 1000  # max iterations
    c.train.checkpoint_every = 25  # checkpoints every 25 iterations
    c.train.mode = "on_policy"
    c.learner.num_minibatches = 1
    c.learner.old_logprobs = "rollout"  # rho = pi_theta / pi_rollout
    c.learner.freeze_vision = True  # the ViT backbone is frozen during RL
    c.learner.max_length = 40000  # max sequence length
    c.rollout.temperature = 0.8  # rollout temperature
    c.rollout.max_turns = 50  # max turns per episode
    c.rollout.max_context_tokens = 40000
    c.advantage.no_verdict_reward = -0.2  # incomplete episode penalty
    c.advantage.item_advantages = "broadcast"  # each segment shares its rollout's advantage
    c.sampler.kind = "frontier"
    c.sampler.frontier.mu = 0.5  # target success rate
    c.sampler.frontier.sigma = 0.25  # bandwidth (ScienceBoard: 0.15)
    c.sampler.frontier.gamma = 0.2  # random sample ratio
    c.sampler.ema_alpha = 0.2  # EMA smoothing
    c.sampler.frontier.pool_factor = 3  # the top 3B tasks form the candidate pool
    c.sampler.calibration.p_min = 0.0  # initial pass-rate range [p_min, p_max]: [0, 1] keeps every task,
    c.sampler.calibration.p_max = 1.0  # so no pilot filter runs (sampler.calibration.enabled stays False)
    c.context.segmenter = "sliding_window"
    c.context.sliding_window.keep = 5  # images to keep K (OSWorld; ScienceBoard: 8)
    c.context.sliding_window.min_removal = 5  # min removal threshold Delta
    # Fig. 4: a dropped screenshot leaves a short text behind (its step and the action taken there).
    c.context.placeholder_text = "[Screenshot of step {step} removed; action: {action}]"
    c.eval.max_turns = 50
    c.eval.max_context_tokens = 40000
    c.eval.temperature = 0.8
    return c
