"""VeriGen task synthesis on the desktop pool: python -m experiments.synthesize --config=experiments/configs/verigen.py

Programmatic roles by default (offline). For the LLM roles set roles="llm" and llm.base_url
(a vLLM server or a hosted API; the key is read from the variable named llm.api_key_env).

Trajectory-guided synthesis from a training run instead of proposals: set from_run.workdir
to the run's workdir (it holds episodes.jsonl) and from_run.task_dirs to the task folders it
trained on; the tasks made are written to <out_dir>/from_run/ (a task folder to train on):

    python -m experiments.synthesize --config=experiments/configs/verigen.py \
        --config.from_run.workdir=runs/x --config.from_run.task_dirs=runs/verigen
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.out_dir = "runs/verigen"
    config.roles = "programmatic"  # or "llm"
    config.seed = 0
    config.target_accepted = 50
    config.max_candidates = 120
    config.workers = 4
    config.defect_rate = 0.0  # programmatic proposer: chance of an injected defect per candidate
    config.verify_from_scratch = True  # re-run every accepted task on a fresh environment

    config.pool = ml_collections.ConfigDict()
    config.pool.size = 4
    config.pool.cpus = 1.0
    config.pool.memory = "1g"

    config.loop = ml_collections.ConfigDict()
    config.loop.use_rules = True
    config.loop.use_judger = True
    config.loop.use_fixer = True
    config.loop.max_fix_rounds = 2
    config.loop.candidates_per_call = 3
    config.loop.judge_timeout_cap = 10.0

    config.llm = ml_collections.ConfigDict()
    config.llm.base_url = "http://127.0.0.1:8000/v1"
    config.llm.model = "Qwen/Qwen3-VL-8B-Instruct"
    config.llm.api_key_env = "OPENAI_API_KEY"
    config.llm.timeout = 120.0
    config.llm.retries = 2
    config.llm.price_prompt = 0.0  # USD per million tokens
    config.llm.price_completion = 0.0

    config.augment = ml_collections.ConfigDict()
    config.augment.composed = 6  # harder multi-objective tasks composed from verified tasks (0: none)
    config.augment.cluster_threshold = 0.6

    config.from_run = ml_collections.ConfigDict()
    config.from_run.workdir = ""  # a training run's workdir ("": synthesize from proposals)
    config.from_run.task_dirs = ()  # the run's task folders: VeriGen output folders or folders of task JSON
    config.from_run.since_step = 0  # pass rates and episodes from this learner step on
    config.from_run.max_pass_rate = 0.5  # failed tasks (at most this pass rate) give sub-tasks
    config.from_run.min_pass_rate = 0.8  # solved tasks (at least this pass rate) are composed
    config.from_run.max_subtasks = 20
    config.from_run.max_composed = 10

    config.audit = ml_collections.ConfigDict()
    config.audit.threshold = 0.90
    return config
