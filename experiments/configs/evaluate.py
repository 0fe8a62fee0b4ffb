"""The run settings an evaluation's policy follows (`python -m experiments.evaluate`): the
agent (action space, prompt, per-turn token budget), the observation (screenshot plus DOM
text, which the oracle reads) and the context. The suite, k, seeds, turn budgets and
temperatures are flags; a training run's workdir as --policy brings its own config instead.

    python -m experiments.evaluate --policy=oracle --suite=miniwob --k=1 --seeds=3 --out=evals/oracle
"""

from experiments.configs.base import base_config


def get_config():
    c = base_config()
    c.name = "evaluate"
    c.workdir = "evals"
    c.env.include_dom_text = True
    c.env.observation = "screenshot"
    c.env.action_space = "coordinates"
    c.rollout.max_new_tokens = 128  # a tool call with typed text fits
    c.eval.max_turns = 15
    # Large pages (click-checkboxes-large, multi-layouts) pass 4,096 tokens of screenshot plus
    # DOM text by their second turn; a model policy's own config keeps its limit.
    c.eval.max_context_tokens = 16384
    c.eval.temperature = 1.0
    c.eval.seed_per_turn = True  # per-request sampling seeds: a resumed or repeated run replays the samples
    return c
