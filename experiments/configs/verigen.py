"""VeriGen task synthesis on the desktop pool: python -m experiments.synthesize --config=experiments/configs/verigen.py

Programmatic roles by default (offline). For the LLM roles set roles="llm" and llm.base_url
(a vLLM server or a hosted API; the key is read from the variable named llm.api_key_env).
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

    config.audit = ml_collections.ConfigDict()
    config.audit.threshold = 0.90
    return config
