"""The embedded default run: online RL of a pretrained Qwen3-VL-architecture policy on MiniWoB++
pages it has never seen, on two CPU cores: 150 updates, which raise its held-out success.

    python -m experiments.main            (this config; bash launch/main.sh sets it up first)

1. The policy is the shipped base (`BASE`, model.init_from): the tiny Qwen3-VL (text 3 layers x
   128, vision 3 blocks x 64) pretrained by `python -m experiments.pretrain
   --config=experiments/configs/pretrain.py` on 960 oracle demonstrations of 24 tasks in the
   `elements` action space (the page's interactive elements numbered in the DOM text and on the
   screenshot; the policy clicks and fills by id). Its manifest.json holds the recipe, the
   commit, the seeds and the held-out figures: element-id digits 0.51 nats each on unseen pages
   against 1.20 for a page-blind prior (it reads the ids off the page), greedy success 0.42
   over 24 tasks x 10 unseen pages.
2. Held-out evaluation "before": `eval.num_seeds` seeds per task that neither the demonstrations
   nor RL use, sampled as in training.
3. Online RL: strictly on-policy GRPO (CANOPY: one update per rollout batch, ratio exactly 1,
   k3 KL 1e-4 to the frozen base, sparse verifier reward, -0.2 for no verdict, no entropy
   bonus) with ScaleCUA's frozen vision tower; the screenshots still go through the tower.
4. Held-out evaluation "after" on the same seeds and per-turn sampling seeds, and the gain with
   Newcombe's intervals, unpaired and paired by seed; metrics, checkpoints, the learning curve
   and episode traces go to the workdir.

Tasks: where the base is neither hopeless nor perfect (greedy success on 10 unseen pages in its
manifest) and where RL corrects its errors: click-dialog-2 0.7, click-tab-2-easy 0.2, click-tab
0.6, each one click or two, so an episode is one or two turns. Not chosen: perfect ones
(click-test, click-test-2, click-dialog, focus-text, click-collapsible, click-button-sequence:
1.0), hopeless ones (the typing tasks and click-checkboxes: 0.0), click-link (0.1: too few
successes per group at this group size), click-button (0.3), the first task until 2026-12-05:
over four 200-update runs it moved 6 -> 7, 6 -> 8, 5 -> 5 and 5 -> 5 of 32 (its failures copy
the wrong label, 'M' for "No"), and click-widget (0.4), the second until 2026-12-05: in every
200-update run its training success fell in the last quarter (seed 1: 139, 169, 149, 127
successes of 400 per quarter, its replies degenerating) and seed 1 lost on it, 19 -> 14 of 48.
48 held-out seeds per task (144 episodes) instead of 32: with paired seeds the interval's
half-width is about 0.09 rather than 0.11.

150 updates: seed 0's run gained as much by update 125 (+0.153 paired) and 150 (+0.174) as by
200 (+0.167); its 200 updates took 35.0 minutes after setup, seed 2's 150 took 27.1.

This config, measured 2026-12-05 (docs/main_job.md has the whole table), held-out success at
the training temperature, paired by seed (95%), and greedily: seed 0 54/144 -> 79/144 (+0.174,
[+0.080, +0.262]; greedily 58 -> 84, +0.181 [+0.100, +0.257]), seed 2 55/144 -> 75/144
(+0.139, [+0.045, +0.228]; greedily 58 -> 85, +0.188 [+0.106, +0.264]), seed 1 56/144 ->
79/144 (+0.160, [+0.062, +0.253]; greedily 58 -> 81, +0.160 [+0.077, +0.239]). The control with
rewards permuted within each batch (advantage.permute_rewards, seed 0's pages and sampling
keys) went 54 -> 56 (+0.014, [-0.072, +0.100]; greedily -0.014): the gain is the reward's.
Seed 0's 150-update figures are its 200-update run's step-150 checkpoint evaluated (the learning
rate is constant and nothing else depends on train.num_steps, so a 150-update run ends in that
state); seed 2's run took 27.1 minutes after setup alone on a 2-core Intel Xeon, with a
compilation cache filled by earlier runs (about 9.3 s per update; Chromium's page resets,
actions and captures used 0.79 of the 2 cores over 30 s of it, sampled from /proc). With
click-widget in place of click-tab-2-easy (200 updates): seed 2 56 -> 78 (+0.153, [+0.060,
+0.241]), seed 0 59 -> 76 (+0.118, [+0.014, +0.218]), seed 1 63 -> 72 (+0.062, [-0.033,
+0.156]). With click-button and click-widget and
32 seeds per task (the config until then, 200 updates): seed 0 30/96 -> 43/96 (+0.135, [+0.015,
+0.250]), seed 1 28/96 -> 44/96 (+0.167, [+0.065, +0.263]), seed 2 34/96 -> 35/96 (+0.010,
[-0.088, +0.109]); its permuted-reward control (advantage.permute_rewards, seed 0's pages and
sampling keys) went 30 -> 26 (-0.042, [-0.138, +0.056]): the gain is the reward's. The same RL
settings for 16 updates (below) moved nothing: what changed is the number of updates, which the
shared prefix work (experiments/benchmarks/rl_step.py) made affordable.

RL settings, measured from this base with click-button as the first task (one run each, 96
held-out episodes, paired by seed):
  2e-4 for 200 updates, seed 2 (where 1e-4 gained +0.010): 34 -> 39 (+0.052, [-0.051,
  +0.153]; greedily 34 -> 40), k3 KL to the base up to 0.79, 0.22 at the end; on seed 2 too,
  1.5e-4: 34 -> 41 (+0.073, [-0.026, +0.169]); groups of 16 for 140 updates: 34 -> 38
  (+0.042, [-0.051, +0.133]); DAPO refill (train.dapo with train.dapo_repeat_tasks: 2.83
  informative groups of 3 per update instead of 1.6, 10.6 s per update), 160 updates: 34 -> 32
  (-0.021, [-0.117, +0.076]);
  learning rate 3e-4, training temperature 0.5, 12 updates of 2 groups: 33 -> 26 (-0.073,
  [-0.162, +0.017]); 1e-4, temperature 1.0, 16 updates of 3 groups (this config before it ran 200): 33 -> 33
  (+0.000, [-0.073, +0.073]; k3 KL to the base 0.005 after 16 updates); 3e-4, temperature 1.0,
  16 updates of 3 groups: 33 -> 29 (-0.042, [-0.129, +0.047]); the same for 48 updates with
  evaluation at the training temperature 1.0: 30 -> 28 (-0.021, [-0.133, +0.092]; k3 KL to the
  base 0.02-0.04 from update 7 on, training success 0.0-0.71 per update with no trend); 1e-3:
  collapse (54% invalid actions by update 9). Two more designs, stopped early: nine
  mid-range pretraining tasks, 8 groups of 4 per update (8 pages instead of 3), two sequential
  mini-batch updates per batch, 2e-4, evaluated at 1.0 (before 34/108): 14 updates, the groups'
  successes fell (click-button 4, 1, 3, 4 of 4 in the first updates, 0-2 after), KL 0.024;
  three tasks the base never saw (identify-shape, grid-coordinate, navigate-tree; 16/96 before
  at 1.0, 3 turns), 3e-4: 11 updates, 0-0.33 training success with no trend, grid-coordinate
  0/8 in every group, KL 0.06, up to 25% invalid actions: on unseen pages the base names
  elements it invents, so its successes are chance. Reward-weighted filtering
(advantage.negative_scale = 0, dr_grpo), evaluated at 1.0 (before 30/96): lr 3e-4, 40 updates:
30 -> 32 (+0.021, paired [-0.084, +0.125]); lr 1e-3: training success fell to 0-0.08 by update
10 (KL 0.1-0.26), also with Adam eps 1e-4. Paired by page against a run at learning rate 0
(the same draws, pages and sampling keys, so a step's difference is the updates' effect, not the
page's difficulty): mean training-success difference per update -0.08 (3e-4, 24 updates), -0.17
(1e-3, eps 1e-4), -0.22 (1e-3): updates on this base lower success on fresh pages of the same
tasks even when they only raise the probability of its own successes, more so at higher rates.
Its successes are mostly chance: on click-button its replies name labels it memorised ('Okay',
'Cancel') whatever the instruction says, and a success is an id that happened to be right. A
base pretrained on four times the demonstrations (pretrain.py with warm_start.demos_per_task =
160, 3,840 pages, 2,000 steps; not shipped) reads pages better (held-out id digits 0.26 nats
against 0.50, reply tokens 0.23 against 0.30) but its greedy success is the same (0.41 over 24
tasks x 10 pages). From it, this config for 40 updates (lr 1e-4, evaluated at 1.0 and greedily):
30 -> 29 (paired -0.010, [-0.101, +0.080]), greedy 33 -> 28 (-0.052, [-0.158, +0.055]), while
training success rose by +0.0049 per update ([+0.0006, +0.0093]; fitted 0.21 -> 0.40). The
permuted-reward control (advantage.permute_rewards, the same pages and sampling keys) rose as
much, +0.0042 ([-0.0006, +0.0090]; 0.22 -> 0.39), with held-out 30 -> 30 and greedy 33 -> 25:
the rise is the draw of pages, not the reward, so the trend is read against that control.
None is a held-out gain; at temperature 0.5 the base's replies are nearly deterministic
(0.02-0.07 nats per token) and half the groups had one outcome, at 1.0 67-100% of the groups
were informative and its tool calls stay valid (96-100%).

CPU-scale choices, each a field to override:
- 3 tasks; two turns per episode; `train.num_steps` updates of 3 groups (one per task) x 8
  episodes;
- sampling temperature 1.0 in training (CANOPY's) and in the headline evaluation, with greedy
  decoding evaluated beside it on the same seeds;
- the compact system prompt (`rollout.prompt_style`), as the base was pretrained with it;
- sequence-mean loss aggregation instead of CANOPY's token-mean: a failed episode usually runs
  both turns and a successful one ends after one, so under token-mean the tokens every reply
  starts with get more negative than positive weight (measured on the earlier warm-started
  policy: after 5 updates every reply was invalid);
- the vision tower frozen in RL (ScaleCUA): the policy grounds its ids on the DOM text, and
  Adam moves every trainable weight by about the learning rate however noisy its gradient.

The segmentation benchmark stays available: --config.job=segmentation_benchmark.
"""

from experiments.configs.base import at_tier, base_config

# The shipped base policy (a Hugging Face directory, relative to the repository root).
BASE = "experiments/bases/miniwob-elements"
# Tasks of one or two clicks where the base is neither hopeless nor perfect (module doc).
TASKS = ("click-dialog-2", "click-tab-2-easy", "click-tab")


def get_config():
    c = base_config()
    c.name = "default"
    c.workdir = "runs/default"
    c.model.name = "qwen3_vl"
    c.model.init_from = BASE
    c.env.action_space = "elements"
    c.env.tasks = at_tier(TASKS)
    c.env.include_dom_text = True
    c.rollout.group_size = 8
    c.rollout.batch_tasks = 3
    c.rollout.max_turns = 2
    # The base's replies name their target as the page does (up to about 80 tokens).
    c.rollout.max_new_tokens = 128
    c.rollout.max_context_tokens = 4096
    c.rollout.temperature = 1.0
    c.rollout.prompt_style = "compact"
    c.train.mode = "on_policy"
    c.learner.old_logprobs = "current"
    c.learner.num_minibatches = 1
    c.learner.rows = 8
    c.loss.clip_eps_low = 0.2
    c.loss.clip_eps_high = 0.2
    c.loss.dual_clip_c = 0.0
    c.loss.kl_coef = 1e-4
    c.loss.entropy_coef = 0.0
    c.loss.aggregation = "seq_mean_token_mean"
    c.learner.freeze_vision = True
    c.optimizer.learning_rate = 1e-4
    c.context.segmenter = "sliding_window"
    c.context.sliding_window.keep = 2
    c.context.sliding_window.min_removal = 1
    c.train.num_steps = 150
    c.train.checkpoint_every = 25
    c.eval.num_seeds = 48  # per task (module doc)
    c.eval.max_turns = 2
    c.eval.concurrent_groups = 16
    # The headline evaluation samples as training does (RL trains the sampled policy); greedy
    # decoding is evaluated beside it on the same seeds. A run that overrides
    # rollout.temperature overrides eval.temperature with it (the two are separate fields).
    c.eval.temperature = c.rollout.temperature
    c.eval.low_temperature = 0.0
    return c
