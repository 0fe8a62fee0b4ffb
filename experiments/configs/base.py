"""The one base of every training recipe: all field names and their defaults live here.

A recipe file (`canopy.py`, `scalecua.py`, `evocua.py`, `default.py`) starts from
`base_config()` and changes values only; it never adds a field, so a typo in a recipe or an
override (`--config.loss.clip_eps_hgih=0.3`) is an error instead of a silently unused value.
`cua_jax.train.settings.TrainSettings.from_config` checks every value at start and names the
field of any bad one.

Who reads what: `experiments/main.py` checks the config, then `cua_jax.train.trainer`'s
`prepare_run` (settings, policy, checkpointer), `warm_start` (the supervised phase, `warm_start.*`)
and `build_trainer` (learner, rollout workers, the task pool and its collector) each take what
they need; `env.*` reaches the environment adapters in `cua_jax.environments` through the rollout
workers, `sampler.*` the task samplers in `cua_jax.tasks`, `eval.*` the evaluation in
`cua_jax.eval`. Library code sits in the layers of `.importlinter` (README.md, "What is where").

Typed sections: `train`, `rollout`, `rollout.vllm`, `eval`, `advantage`, `warm_start`,
`sampler.frontier`, `sampler.dtac`, `sampler.curriculum`, `sampler.calibration` and
`sampler.pilot` hold exactly the fields of the dataclass each fills, by the same names
(`TrainLoopConfig`, `RolloutSettings`, `VllmSettings` and `AdvantageSettings` of
`cua_jax.train.settings`, `cua_jax.eval.held_out.EvalConfig`, `cua_jax.train.sft.WarmStartConfig`,
the sampler configs of `cua_jax.tasks.samplers`, `cua_jax.tasks.calibration.CalibrationConfig`,
`cua_jax.eval.pilot.PilotConfig`); each value is checked once, by its dataclass, and the library
reads those dataclasses from `TrainSettings`. So are the segmenters' sections
`context.sliding_window`, `context.step_wise` and `context.compact_context`, each its
segmenter's options dataclass of `cua_jax.context.segment.SEGMENTER_OPTIONS`
(`SlidingWindowOptions`, ...) with the `context.placeholder_text` the segmenters that drop
screenshots share (whole_trajectory takes no options); `context.segmenter` picks one. So are
the fields of `env` every environment kind shares (`EnvSettings`: observation,
include_dom_text, action_space, time_limit_s, the seeds, drop_hardest_tier, domain_weights);
the task sources (env.kind, env.tasks, env.task_dirs) and each kind's own section are read with
the task catalog. `env.tasks` holds (MiniWoB task, tier) records. Each environment kind's
section holds its config dataclass's fields: `env.capsules` (MiniWoB's `CapsuleOptions`),
`env.desktop` (`PoolConfig`), `env.code` (`CodeEnvConfig`), and `env.<name>` of a kind
registered by a module named in `env.kind_modules` (`cua_jax.environments.kinds`;
docs/environments.md, "Adding an environment kind").

Renames: a field renamed since a run was saved is read under its new name through
`renames.RENAMED` (`config_from_dict`: a run's workdir for --resume and
`experiments.evaluate --policy`, a base's manifest), so saved runs keep loading.

Conventions: a disabled optional number is 0 (e.g. `loss.dual_clip_c = 0.0` turns the dual
clip off), so every field keeps one type and overrides from the command line type-check.
"""

from __future__ import annotations

import ml_collections

from cua_jax.envs.faults import AGENT_OWNED_FAULTS
from experiments.configs.renames import renamed

# MiniWoB++ tasks the scripted oracle solves (cua_jax.envs.miniwob_oracle.ORACLE_TASKS): the
# embedded run's pool, so the warm start has demonstrations for every task.
MINIWOB_TASKS = (
    "click-button",
    "click-link",
    "focus-text",
    "click-dialog",
    "click-tab",
    "click-checkboxes",
    "enter-text",
)
# Tasks the oracle solves in both action spaces, in at most 6 actions by element id (success rates and seed
# counts per space: cua_jax/envs/miniwob_oracle.py's docstring, measured by
# experiments/benchmarks/oracle_coverage.py): the pretraining set of a base policy.
ORACLE_BOTH_SPACES = MINIWOB_TASKS + (
    "click-option",
    "click-test",
    "click-test-2",
    "click-button-sequence",
    "click-dialog-2",
    "use-autocomplete",
    "click-collapsible",
    "enter-text-2",
    "focus-text-2",
    "enter-password",
    "login-user",
    "click-widget",
    "unicode-test",
    "multi-orderings",
    "multi-layouts",
    "enter-text-dynamic",
    "click-tab-2-easy",
)


def at_tier(tasks, tier: int = 0) -> tuple[tuple[str, int], ...]:
    """env.tasks' (task, tier) records of `tasks`, every one at `tier`."""
    return tuple((task, tier) for task in tasks)


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.job = "train"  # a key of experiments.main.JOBS
    c.name = "base"
    c.workdir = "runs/base"
    c.seed = 0  # base of every random stream of the run (task draws, seeds, sampling, init)
    # XLA's compiled programs kept on disk (launch/setup.sh empties the folder past 4 GiB), so a run,
    # a resumed run or the next run skips compiling a program another already compiled. "": off.
    c.compilation_cache_dir = "~/.cache/cua_jax/xla"

    # The policy. "tiny_qwen3_vl" / "tiny_qwen3": random inits of the tiny Qwen3-VL / text-only
    # Qwen3 (with the shipped tokenizer); "qwen3_vl" / "qwen3": the Qwen3-VL
    # (Qwen3VLForConditionalGeneration) / Qwen3 (Qwen3ForCausalLM) checkpoint in model.init_from,
    # a Hugging Face directory: config.json, safetensors (sharded or not), and its tokenizer, chat
    # template and (Qwen3-VL) processor files, which the run then uses. A text-only policy reads
    # the page as text: env.observation = "text". "qwen3_5" / "qwen3_5_text": a Qwen3.5
    # (Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM) directory, the hybrid Gated DeltaNet
    # model (cua_jax.models.qwen3_5); "tiny_qwen3_5": its random tiny vision-language init.
    c.model = ml_collections.ConfigDict()
    c.model.name = "tiny_qwen3_vl"
    c.model.init_from = ""
    c.model.num_layers = 0  # decoder layers (0: the named model's own; random init only)
    c.model.tokenizer_dir = ""  # "" : model.init_from's tokenizer + processor, else the shipped tiny pair
    # Precision (float32 | bfloat16). param_dtype: how the policy's weights are stored (bfloat16: the
    # optimizer keeps float32 master weights and moments). compute_dtype: activations and matmul
    # inputs; softmaxes, norms, logits, logprobs and the loss stay float32 either way.
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat = False  # recompute each decoder layer / vision block in the backward pass (less memory)

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    # Multi-host: one process per host joins jax.distributed before any JAX computation
    # (launch/multihost.sh sets these from SLURM or the environment). "" / 0 / -1: let JAX
    # detect the coordinator, process count and process id from the cluster environment.
    c.mesh.distributed = False
    c.mesh.coordinator_address = ""  # host:port of process 0's coordination service
    c.mesh.num_processes = 0
    c.mesh.process_id = -1
    # Seconds after which a process that stopped sending heartbeats (killed, crashed, its host or
    # network down) counts as lost: every other process stops with an error naming it (process
    # index and host) and exit status 75, and the run continues from its last checkpoint when
    # every process is relaunched with --resume (cua_jax/models/liveness.py). JAX's own heartbeat
    # timeout is set to twice it. Shorter notices a loss sooner; it must stay well above the
    # longest time a live process can be stalled whole (swapping, a frozen VM), not above a
    # long compile or step: the beats come from a thread of their own.
    c.mesh.heartbeat_timeout_s = 100.0

    # Tasks. env.kind: "miniwob" (env.tasks, MiniWoB++ in capsules of a shared browser),
    # "desktop" (env.task_dirs, OSWorld-format task JSON on pooled Docker desktops), "mixed"
    # (both), "code" (env.code) or a plugin kind. cua_jax/tasks/sources.py says how a folder's
    # tasks get their domains.
    c.env = ml_collections.ConfigDict()
    c.env.kind = "miniwob"
    # Modules imported before the config is checked: each registers environment kinds of its own
    # (cua_jax/environments/kinds.py, docs/environments.md). env.kind may then name one: its tasks
    # come from its registry entry, its config from a section env.<kind> when the config has one.
    c.env.kind_modules = ()
    # Folders of OSWorld-format task JSON at any depth: the desktop suite
    # (cua_jax/tasks/suites/desktop), a folder experiments/synthesize.py wrote, OSWorld's examples/.
    c.env.task_dirs = ()
    # "all": every file of env.task_dirs must parse (a schema error stops the run, naming it).
    # "runnable": only the tasks that run here (OSWorld's evaluation_examples/examples as it is):
    # those that parse, need nothing env.desktop.image lacks (an app, the network, a step, getter
    # or metric the project does not implement; `python -m experiments.tasks check`) and are not
    # flagged by the folder's untouched record (`python -m experiments.tasks untouched`).
    c.env.task_filter = "all"
    # Per-domain sampling weights, "domain=weight" each: a domain's share of the draws is
    # proportional to its weight (unlisted domains: 1), whatever its task count. () : every
    # task weighs the same. Success and quarantines are logged per domain either way.
    c.env.domain_weights = ()
    # The Docker desktop pool of each rollout worker (desktop tasks): sized, health-checked,
    # and every environment recycled (a fresh container) after each episode. The fields are
    # cua_jax.envs.docker_pool.PoolConfig's (its socket_root, None, keeps its default: a fresh
    # temporary directory; the image is resolved to its exact tag when the run starts).
    c.env.desktop = ml_collections.ConfigDict()
    c.env.desktop.image = "desktop"  # launch/images/<image>; a task's "snapshot" must name it
    c.env.desktop.size = 4  # containers kept ready per worker
    c.env.desktop.cpus = 1.0
    c.env.desktop.memory = "1g"
    c.env.desktop.pids_limit = 1024
    c.env.desktop.screen = "1280x800"
    c.env.desktop.reset_mode = "recreate"  # recreate (clean files) | restart (faster, files stay)
    c.env.desktop.ready_timeout = 240.0  # seconds a new container has to answer its health probe
    c.env.desktop.call_timeout = 30.0  # seconds: the default timeout of an environment call
    c.env.desktop.docker_timeout = 60.0  # seconds: a Docker API call's timeout
    c.env.desktop.health_interval = 10.0  # seconds between health checks of idle containers (0: on acquire only)
    c.env.desktop.health_timeout = 10.0  # seconds a health probe may take before the server counts as hung
    # Code tasks (env.kind = "code"): bugs injected into real Python repositories, each episode in
    # a `--network none` container of the code image with a shell and a file editor as its tools,
    # judged on submit by the repository's own tests (cua_jax/environments/code_env.py). Beside
    # suite_dir and tasks (the run's tasks), the fields are CodeEnvConfig's: its partial_credit
    # follows advantage.reward ('pass_fraction'); image and max_turns, None, keep their defaults
    # (the code image built when missing; the agent loop's step budget alone).
    c.env.code = ml_collections.ConfigDict()
    c.env.code.suite_dir = "cua_jax/tasks/suites/code"  # a folder of code task JSON (from the repository root)
    c.env.code.tasks = ()  # ids of the folder's tasks the run uses (() : all of them)
    # pooled: one container per environment, reset to a clean tree each episode | fresh: one per episode
    c.env.code.reset_mode = "pooled"
    c.env.code.cpus = 1.0
    c.env.code.memory = "512m"  # without swap: a memory hog is OOM-killed and its episode quarantined
    c.env.code.pids_limit = 128  # a fork bomb hits it and its episode is quarantined
    c.env.code.work_size = "64m"  # the size-capped tmpfs holding the work tree
    c.env.code.tmp_size = "16m"  # the size-capped tmpfs /tmp
    c.env.code.work_free_min = 256 * 1024  # bytes left on the work tree under which it counts as filled
    c.env.code.default_timeout = 30.0  # seconds: a bash call's timeout when it names none
    c.env.code.max_timeout = 300.0  # seconds: the most a bash call may ask for
    c.env.code.output_limit = 8000  # bytes shown of each of stdout and stderr (its first and last halves)
    c.env.code.docker_timeout = 60.0  # seconds a Docker API call may take beyond the work it waits for
    # What the policy is shown: "screenshot" (the task region, plus the DOM as text when
    # env.include_dom_text) or "text" (the DOM as text only: text-only policies, web agents).
    c.env.observation = "screenshot"
    # MiniWoB++ tasks as (task, difficulty tier) records, tier 0 the easiest (tiers group the
    # pilot's coverage report and env.drop_hardest_tier; at_tier gives a list one tier).
    c.env.tasks = at_tier(MINIWOB_TASKS)
    c.env.drop_hardest_tier = False  # CANOPY keeps the hardest tier (Table A1 "hardest tier kept")
    c.env.include_dom_text = True  # MiniWoB's DOM as text beside the screenshot
    # How the policy points: "coordinates" (grid points), "elements" (element ids, drawn on the
    # screenshot as set-of-marks and listed in the DOM text) or "both".
    c.env.action_space = "coordinates"
    c.env.time_limit_s = 600.0  # replaces MiniWoB's 10 s limit (a CPU-sampled turn is slower)
    # The MiniWoB capsules of each rollout worker (cua_jax/envs/capsules/): pages of private
    # sites in `renderers` cells that share a renderer process each (0: a browser context per
    # capsule), `warm_pages` loaded pages per task kept ready for resets and forks, and forks
    # from captured page state where that is exact ("capture") or always by replay ("replay").
    # `episodes_per_page`: how many episodes of a task one page serves, each begun in the page
    # the last one ended in (seeded, as MiniWoB++'s own environment restarts), before a new
    # page replaces it; 1 loads a new page on a new site for every reset, which costs a page
    # load (most of a reset's time, experiments/benchmarks/rl_step.py).
    # The fields are cua_jax.envs.capsules.CapsuleOptions'.
    c.env.capsules = ml_collections.ConfigDict()
    c.env.capsules.renderers = 2
    c.env.capsules.warm_pages = 2
    c.env.capsules.fork_by = "capture"
    c.env.capsules.episodes_per_page = 8
    c.env.train_seed_max = 1_000_000  # training problem seeds are drawn from [0, train_seed_max)
    # Or from these fixed seeds (() : the range above): RL on a few fixed pages is the check
    # that the loop learns what it is rewarded for, before asking it to transfer.
    c.env.train_seeds = ()
    c.env.eval_seed_start = 1_000_000  # held-out seeds: [eval_seed_start, + eval.num_seeds)

    # Rollout: group size, batch of tasks, the agent loop's budgets and sampling.
    c.rollout = ml_collections.ConfigDict()
    c.rollout.engine = "jax"  # "jax": the built-in JAX sampler | "vllm": vLLM engines in Ray actors
    c.rollout.num_workers = 1  # rollout workers (each: a capsule runtime + an engine)
    c.rollout.worker_backend = "local"  # local: in the trainer's process | ray: one Ray actor each
    c.rollout.worker_cpus = 1.0  # ray: logical CPUs each worker actor reserves
    # ray, across nodes: a placement-group strategy over one bundle per worker actor ("" : Ray
    # places each), and a custom resource only rollout nodes advertise (1 per actor; "" : none).
    c.rollout.worker_placement = ""
    c.rollout.worker_node_resource = ""
    c.rollout.ray_object_store_mb = 256  # ray: object store of the local Ray the trainer starts
    c.rollout.group_size = 8  # n rollouts per task
    c.rollout.batch_tasks = 4  # tasks per step (train batch)
    c.rollout.max_turns = 15
    c.rollout.max_new_tokens = 64  # per-turn generation cap
    c.rollout.max_context_tokens = 4096  # prompt + response budget of one turn
    c.rollout.max_response_tokens = 0  # whole-episode response cap (0: none); CANOPY 32,768
    c.rollout.max_observation_tokens = 0  # observation cap (0: none); CANOPY 4,096
    # How the system prompt lists the action space: "tool_schema" (the JSON schema, as Qwen's
    # template lists tools) or "compact" (one line per action, ~half the tokens).
    c.rollout.prompt_style = "tool_schema"
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    # True: every training request samples from a stream of its own, turn_sampling_seed(seed,
    # episode id, environment seed, turn), as evaluation's do (eval.seed_per_turn), so an episode
    # samples the same tokens whichever worker or host runs it and whatever batch it shares.
    # False: each generation batch draws from the engine's own running key.
    c.rollout.seed_per_turn = False
    # Partial rollouts (JAX sampler): 0, a weight update waits for the replies being generated;
    # N, replies grow N tokens at a time and an update lands between chunks, the rest of each
    # reply sampled under the new weights (every token tagged with its policy version).
    c.rollout.partial_rollout_tokens = 0
    # Async streaming: 0, each rollout thread runs a draw's groups together and starts the next
    # draw when all have ended; N, it keeps up to N episodes in flight on its worker and buffers
    # each group as soon as its last episode ends (local workers).
    c.rollout.max_episodes_in_flight = 0
    # Work the JAX sampler does not repeat (vLLM's automatic prefix caching does the same there):
    # share_prompts prefills once the prompt part several prompts of a generation batch share (a
    # group's first prompt, its screenshot encoded once); prefix_cache_tokens > 0 keeps each
    # episode's keys and values between its turns (at most this many cache slots in all), so a turn
    # prefills only its new tokens. Both give the tokens and logprobs of the full recomputation (to
    # float rounding); the cache is dropped at every weight update. 0 / False: recompute.
    c.rollout.share_prompts = True
    c.rollout.prefix_cache_tokens = 65536
    # shared_prefix_attention: the rows of a generation batch that continue the same cached prefix
    # (a group's members after their shared first prompt) attend it held once (cascade attention)
    # instead of a copy in each row's cache, so a decoding step reads its keys and values once per
    # group; the same tokens and logprobs to float rounding. False: each row holds a copy.
    c.rollout.shared_prefix_attention = True
    c.rollout.batch_wait_s = 0.0  # 0: a generation batch waits for every running episode
    # "fresh": each episode of a group resets on its own; "shared": the group starts from one
    # prepared state (one reset, the others fork it: a capsule fork for MiniWoB, the task's
    # setup again for a desktop; experiments/benchmarks/group_fork.py times both ways).
    c.rollout.group_start = "fresh"
    # rollout.engine = "vllm": each rollout worker sends its generations through a Router to
    # `engines` vLLM engines, each in a Ray actor of its own, serving the policy exported to
    # <workdir>/engine_model; weights are synced after every update.
    c.rollout.vllm = ml_collections.ConfigDict()
    c.rollout.vllm.engines = 1  # engine actors per rollout worker
    c.rollout.vllm.cpus_per_engine = 1.0  # Ray CPUs each engine actor reserves
    c.rollout.vllm.gpus_per_engine = 0.0
    c.rollout.vllm.dtype = "float32"
    c.rollout.vllm.kv_cache_mb = 256  # KV cache per engine (host memory on CPU); 0: sized by vLLM
    c.rollout.vllm.gpu_memory_utilization = 0.5  # GPU: the share of the device an engine may take
    c.rollout.vllm.max_num_seqs = 32
    c.rollout.vllm.max_retries = 0  # retries of a dead engine's requests before their episodes are quarantined
    c.rollout.vllm.threads = 1  # OMP threads per engine on CPU
    # Across nodes: "" lets Ray place each engine actor; PACK / SPREAD / STRICT_PACK /
    # STRICT_SPREAD reserve one placement-group bundle per engine first. node_resource: a custom
    # Ray resource only rollout nodes advertise (each engine reserves 1 of it); "" for none.
    c.rollout.vllm.placement = ""
    c.rollout.vllm.node_resource = ""
    # vLLM's log level in the engine actors (their output reaches the run's): its INFO lines
    # and a CPU-backend thread warning repeated per call would bury the run's own output.
    c.rollout.vllm.log_level = "ERROR"

    # Context management (cua_jax.context.segment.make_segmenter): the segmenter, the text the
    # segmenters that drop screenshots share, and a section per segmenter with its own options
    # (whole_trajectory takes none).
    c.context = ml_collections.ConfigDict()
    c.context.segmenter = "sliding_window"  # sliding_window | step_wise | compact_context | whole_trajectory
    # sliding_window / step_wise: the text a dropped screenshot leaves behind (ScaleCUA Fig. 4), a
    # format string over {step} and {action} (that turn's action); "": the screenshot just goes.
    c.context.placeholder_text = ""
    c.context.sliding_window = ml_collections.ConfigDict()
    c.context.sliding_window.keep = 5  # K: images kept
    c.context.sliding_window.min_removal = 5  # Delta: images dropped at once
    c.context.step_wise = ml_collections.ConfigDict()
    c.context.step_wise.keep_images = 1  # screenshots kept per step item
    c.context.compact_context = ml_collections.ConfigDict()
    c.context.compact_context.window = 3  # recent turns kept in full

    # Rewards and advantages.
    c.advantage = ml_collections.ConfigDict()
    c.advantage.estimator = "grpo"  # grpo | dr_grpo | rloo
    c.advantage.std_eps = 1e-6
    c.advantage.no_verdict_reward = -0.2  # incomplete episodes (turn / token budget ran out)
    # Multiplies negative advantages, in [0, 1]: 1 the estimator as published, 0 reward-weighted
    # filtering (RAFT / ReST: only episodes above their group's mean push the policy).
    c.advantage.negative_scale = 1.0
    # Faults scored as the agent's failure (reward 0, kept in the group) rather than quarantined;
    # faults.AGENT_OWNED_FAULTS says why these. Any of faults.FAULT_KINDS may be listed.
    c.advantage.agent_faults = tuple(kind.value for kind in AGENT_OWNED_FAULTS)
    # A sensitivity check, not a recipe (CANOPY App. G): every episode that would be quarantined
    # (any cause, the worker's too) stays in its group scored as a failure, counted as
    # quarantine/scored_as_failure beside quarantine/<kind>.
    c.advantage.quarantine_as_failure = False
    c.advantage.item_advantages = "broadcast"  # broadcast (ScaleCUA) | stepo (EvoCUA-1.5)
    # "sparse": the verifier's {0, 1} reward; "pass_fraction" (code tasks): the share of the
    # fail-to-pass tests a fix makes pass, 0 if it breaks another (CANOPY eq. 1's dense form).
    c.advantage.reward = "sparse"
    # CANOPY's SWE terminal constants (App. H, -0.2 each there) for a code episode that leaves
    # nothing to test: no change to the package's sources or one that cannot be applied
    # (no_patch), a test run that hangs or crashes (crash); a timeout is no_verdict_reward's.
    # 0: scored as a plain failure.
    c.advantage.no_patch_reward = 0.0
    c.advantage.crash_reward = 0.0
    # A control, not a recipe: each episode's advantage is computed from the outcome of another
    # episode of its batch (a seeded permutation per update), everything else unchanged. RL on it
    # learns nothing about success; what a real run gains beyond it is RL's.
    c.advantage.permute_rewards = False

    # The policy loss (cua_jax.rl.losses.PolicyLossConfig).
    c.loss = ml_collections.ConfigDict()
    c.loss.clip_eps_low = 0.2
    c.loss.clip_eps_high = 0.28
    c.loss.dual_clip_c = 3.0  # 0: no dual clip
    c.loss.kl_coef = 1e-4
    c.loss.kl_estimator = "k3"
    c.loss.entropy_coef = 0.0
    c.loss.aggregation = "token_mean"
    c.loss.fixed_denominator = 0.0  # 0: unset (only the fixed_denominator mode reads it)
    c.loss.tis_cap = 0.0  # truncated importance sampling of engine-vs-learner logprobs: cap >= 1 (0: off)
    # "ppo" | "decoupled": AReaL's decoupled objective for stale (async) data, clipped against
    # the proximal policy (learner.old_logprobs = "recompute"), weighted by proximal / behaviour
    # (the engine's logprobs); tokens whose weight passes tis_cap (> 0) are left out.
    c.loss.surrogate = "ppo"

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.learning_rate = 3e-6
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 0
    c.optimizer.decay_steps = 1000
    c.optimizer.min_lr_ratio = 0.0
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-8
    c.optimizer.weight_decay = 0.0
    c.optimizer.max_grad_norm = 1.0  # 0: no clipping

    # The learner and its batches.
    c.learner = ml_collections.ConfigDict()
    c.learner.old_logprobs = "current"  # current (strictly on-policy) | recompute | rollout
    c.learner.freeze_vision = False
    c.learner.num_minibatches = 1  # optimizer updates per rollout batch (whole groups each)
    c.learner.rows = 4  # sequences per micro-batch (gradient accumulation only)
    # A group's items share one prefix row, their common prompt, run once by the learner, the
    # reference and the old-logprob scorer (exact gradients; False: every item runs whole).
    c.learner.share_prefix = True
    c.learner.suffix_length_multiple = 64  # share_prefix: what follows a prefix pads to this (0: length_multiple)
    c.learner.length_multiple = 128
    c.learner.max_length = 0  # longest item allowed (0: no limit); ScaleCUA 40,000
    c.learner.seq_chunk = 256
    c.learner.vocab_chunk = 32768

    # The training loop.
    c.train = ml_collections.ConfigDict()
    c.train.mode = "on_policy"  # on_policy | async
    c.train.num_steps = 10
    c.train.staleness_window = 0  # async: a group of version v trains at version <= v + window
    c.train.buffer_groups = 0  # async: rollout buffer capacity in groups (0: 2 x batch_tasks)
    c.train.dapo = False  # DAPO dynamic sampling: keep informative groups only, draw more
    c.train.dapo_max_rounds = 3
    c.train.dapo_oversample = 1.0
    # DAPO: once every task was drawn this step, refill rounds draw the tasks again on new pages
    # (a small pool, such as the main job's three tasks, would end the step short otherwise).
    c.train.dapo_repeat_tasks = False
    c.train.checkpoint_every = 5  # steps between checkpoints (the last step is always saved)
    c.train.keep_checkpoints = 2
    c.train.progress_bar = True
    # Every this many steps, eval.num_traces episodes of the batch are saved for the viewer
    # (traces/train_<step>: screenshots, replies, rollout and learner logprobs, advantages). 0: never.
    c.train.trace_every = 0
    # Multi-host (launch/multihost.sh): each process collects only its share of every step's
    # groups (whole groups, dealt by expected cost) with its own engines, and its items are its
    # shard of the global batch; samplers, metrics and the loss cover every process's groups
    # exactly as one process collecting everything would (cua_jax/train/coordinated.py). async
    # mode: each process's rollout threads fill a buffer of its own (its share of buffer_groups)
    # with its share of every draw, its sampler sees its own groups, a step trains every
    # process's share at once within staleness_window of the global policy version (the learner
    # step), and checkpoints keep every process's rollout state (<workdir>/process_states), so
    # --resume loses no episode and trains none twice; rollout.batch_tasks >= process count.
    # Each process's engines are its own (the JAX sampler in-process or in Ray actors, or vLLM
    # engines on a local Ray serving <workdir>/engine_model/process_<index>), synced with the
    # whole policy after every update; evaluations split their seeds across the processes and
    # exchange the records. Needs text observations, rollout.seed_per_turn (and
    # eval.seed_per_turn), and no warm start or training traces yet (each refused at start,
    # naming the field). Required with more than one process (a ConfigError otherwise);
    # launch/multihost.sh sets it True.
    c.train.coordinated = False

    # Task sampling (cua_jax.tasks.samplers.build_sampler). Each subsection holds the fields of
    # the dataclass it fills, by the same names: sampler.frontier FrontierConfig, sampler.dtac
    # DTACConfig, sampler.curriculum CurriculumConfig (cua_jax.tasks.samplers), sampler.calibration
    # CalibrationConfig (cua_jax.tasks.calibration), sampler.pilot PilotConfig (cua_jax.eval.pilot).
    c.sampler = ml_collections.ConfigDict()
    c.sampler.kind = "uniform"  # uniform | frontier | dtac | curriculum
    # Every kind's pass-rate estimates: their EMA's weight of a new rate, and a task's before any.
    c.sampler.ema_alpha = 0.2
    c.sampler.unknown_pass_rate = 0.5
    c.sampler.frontier = ml_collections.ConfigDict()
    c.sampler.frontier.mu = 0.5  # target success rate
    c.sampler.frontier.sigma = 0.25  # bandwidth
    c.sampler.frontier.gamma = 0.2  # random sample ratio
    c.sampler.frontier.pool_factor = 3  # candidate pool = pool_factor x B
    c.sampler.dtac = ml_collections.ConfigDict()
    c.sampler.dtac.p_low = 0.0  # positive-replay band
    c.sampler.dtac.p_high = 0.5
    c.sampler.dtac.max_replays_per_trajectory = 2
    c.sampler.dtac.replay_cache_size = 4
    c.sampler.dtac.rho_inf = 0.0  # infeasible share of the batch
    # The fixed-schedule baseline of ScaleCUA Fig. 6a: tasks ordered once by "tier" or "pass_rate"
    # (the pilot's), the easiest `start` share open at the first draw, all of it after `steps`
    # draws, widened "linear"-ly or as "sqrt".
    c.sampler.curriculum = ml_collections.ConfigDict()
    c.sampler.curriculum.difficulty = "tier"
    c.sampler.curriculum.start = 0.25
    c.sampler.curriculum.steps = 100
    c.sampler.curriculum.schedule = "sqrt"
    # The pilot filter to the band [p_min, p_max] (sampler.pilot.enabled) and periodic pass-rate
    # calibration: every every_k_steps steps (0: never) sample_size tasks re-estimated with
    # group_size rollouts each. keep_infeasible: infeasible tasks stay active whatever their rate.
    c.sampler.calibration = ml_collections.ConfigDict()
    c.sampler.calibration.enabled = False
    c.sampler.calibration.p_min = 0.0
    c.sampler.calibration.p_max = 1.0
    c.sampler.calibration.every_k_steps = 0
    c.sampler.calibration.sample_size = 64
    c.sampler.calibration.group_size = 8
    c.sampler.calibration.keep_infeasible = True
    # CANOPY's pilot pass (`python -m experiments.evaluate --pilot`): group_size samples per
    # training task; the group-size floor gives the hardest tier signal coverage `target`
    # (eq. 5). A run given its pilot `file` takes rollout.group_size from the floor and its
    # tasks' pass rates from the pilot (no pilot of its own then). enabled: with calibration on,
    # the run's own pilot filter.
    c.sampler.pilot = ml_collections.ConfigDict()
    c.sampler.pilot.enabled = True
    c.sampler.pilot.group_size = 8
    c.sampler.pilot.target = 0.9
    c.sampler.pilot.file = ""

    # Evaluation on held-out seeds through the evaluation harness (cua_jax.eval), before and
    # after training and every every_steps steps (0: never in between).
    c.eval = ml_collections.ConfigDict()
    c.eval.enabled = True
    c.eval.tasks = ()  # () : the training tasks
    c.eval.num_seeds = 4  # held-out problem seeds per task
    c.eval.group_size = 1  # episodes per (task, seed)
    c.eval.concurrent_groups = 8  # (task, seed) groups per worker call (batched generation)
    c.eval.every_steps = 0
    c.eval.max_reruns = 1  # reruns of a quarantined sample before it is given up
    c.eval.max_turns = 15  # turn budget at evaluation (CANOPY raises it over training's)
    c.eval.max_context_tokens = 4096
    # CANOPY's test-time YaRN (to a 61k context): > 1 evaluates the policy with its rope extended
    # by YaRN at this factor over the model's max_position_embeddings, same weights; training
    # keeps the model's own rope. 0: off. JAX engine, Qwen3 / Qwen3-VL only.
    c.eval.rope_scaling = 0.0
    c.eval.temperature = 1.0
    # >= 0: the before and after evaluations also run at this lower temperature (0: greedy) on
    # the same seeds, and their paired gain is reported after the headline's. < 0: off.
    c.eval.low_temperature = -1.0
    c.eval.top_p = 1.0
    c.eval.top_k = 0
    # Each evaluation turn samples from its own stream, seeded by (config.seed, episode id, seed,
    # turn): evaluations before and after training share their random numbers, so the gain
    # paired by seed measures the policy change, not the sampling noise.
    c.eval.seed_per_turn = True
    # An evaluation episode that runs out of turns is judged on the state it reached, as OSWorld
    # scores its step limit (environments that can judge an unfinished episode: desktops); False:
    # it ends NO_VERDICT unjudged, as in training. Desktop suites of experiments.evaluate set it.
    c.eval.judge_at_budget = False
    c.eval.confidence = 0.95  # Wilson interval level
    c.eval.num_traces = 3  # episode traces saved per evaluation

    # Supervised warm start on the MiniWoB oracle's demonstrations, before RL (and before the
    # "before" evaluation): cua_jax.train.warm_start. Needs env.include_dom_text (the oracle
    # reads the page back out of the prompt) and tasks the oracle solves. Its demonstrations use
    # training seeds 0 .. demos_per_task - 1 (never held-out ones). The KL reference is the
    # warm-started policy. A resumed run skips it (the checkpoint holds its result). The section
    # holds the fields of cua_jax.train.sft.WarmStartConfig by its names; the learner's
    # length_multiple, seq_chunk and vocab_chunk and the run's seed fill the rest.
    c.warm_start = ml_collections.ConfigDict()
    c.warm_start.steps = 0  # SFT optimizer steps (0: no warm start)
    c.warm_start.demos_per_task = 8
    c.warm_start.rows = 2  # demonstration items per SFT step
    c.warm_start.learning_rate = 3e-3
    c.warm_start.warmup_steps = 10
    c.warm_start.schedule = "constant"  # after the warmup: "constant" or "cosine" (to min_lr_ratio x lr)
    c.warm_start.min_lr_ratio = 0.0
    c.warm_start.weight_decay = 0.0  # AdamW's, as optimizer.weight_decay
    c.warm_start.max_grad_norm = 1.0  # 0: no clipping
    c.warm_start.concurrency = 4  # oracle episodes run at once
    # Oracle demonstrations on this many held-out seeds per task (after the evaluation seeds,
    # never trained on), scored after the warm start: held-out NLL, and NLL per click-point
    # digit against a page-blind prior (does the policy read its clicks off the page?).
    c.warm_start.held_out_seeds = 0

    # Pretraining a base policy (python -m experiments.pretrain): the warm start's supervised
    # learning (warm_start.steps, rows, learning_rate, schedule, demos_per_task, held_out_seeds)
    # run long, resumable, scored on held-out pages as it goes, and exported as a Hugging Face
    # directory that model.init_from loads.
    c.pretrain = ml_collections.ConfigDict()
    c.pretrain.checkpoint_every = 100  # SFT steps between resumable state saves
    c.pretrain.eval_every = 250  # SFT steps between held-out NLL scores (0: only at the end)
    c.pretrain.eval_seeds = 10  # held-out pages per task for the final greedy success
    c.pretrain.export_dir = ""  # "" : <workdir>/base
    return c


def config_from_dict(saved: dict) -> ml_collections.ConfigDict:
    """A config saved as a dict (a run's checkpoint, a base's manifest recipe), on today's base:
    fields renamed since are read under their new names (`renames.RENAMED`), fields the dict
    lacks (added since it was saved) keep their defaults, lists become the tuples the base
    declares, and a field the base does not know is an error naming it."""
    config = base_config()

    def merge(target: ml_collections.ConfigDict, values: dict, prefix: str) -> None:
        for key, value in values.items():
            if key not in target:
                raise KeyError(f"config.{prefix}{key}: not a field of experiments/configs/base.py")
            if isinstance(target[key], ml_collections.ConfigDict):
                merge(target[key], value, f"{prefix}{key}.")
            elif isinstance(target[key], tuple) and isinstance(value, list):
                target[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            else:
                target[key] = value

    merge(config, renamed(saved), "")
    return config
