"""Qwen3-VL-2B-Instruct (or any Qwen3-VL checkpoint in transformers format) on a GPU machine:
vLLM rollouts on Ray, bf16 learner with rematerialisation, MiniWoB++ in browser capsules.

    python -m experiments.main --config=experiments/configs/qwen3_vl_gpu.py \
        --config.model.init_from=/path/to/Qwen3-VL-2B-Instruct

The tokenizer, chat template and image processor come from that directory. The learner keeps
bfloat16 parameters with float32 master weights and moments (model.param_dtype) and
recomputes each decoder layer and vision block in the backward pass (model.remat). One vLLM
engine per rollout worker takes one GPU (rollout.vllm.gpus_per_engine) and half of its
memory; the learner's JAX must leave it that room (XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 when
they share a device). CANOPY's on-policy settings (Table A1) with ScaleCUA's frozen vision
tower; a training run writes metrics, checkpoints and traces to the workdir, and
`python -m experiments.export --workdir=runs/qwen3_vl_gpu --out=DIR` writes the trained
policy as a Hugging Face directory.
"""

from experiments.configs.base import ORACLE_BOTH_SPACES, at_tier, base_config


def get_config():
    c = base_config()
    c.name = "qwen3_vl_gpu"
    c.workdir = "runs/qwen3_vl_gpu"
    c.model.name = "qwen3_vl"
    c.model.init_from = ""  # required: the checkpoint directory (see the module doc)
    c.model.param_dtype = "bfloat16"
    c.model.compute_dtype = "bfloat16"
    c.model.remat = True
    c.env.tasks = at_tier(ORACLE_BOTH_SPACES)  # the 24 tasks the oracle solves in both action spaces
    c.env.include_dom_text = True
    c.env.action_space = "both"
    c.rollout.engine = "vllm"
    c.rollout.vllm.dtype = "bfloat16"
    c.rollout.vllm.gpus_per_engine = 1.0
    c.rollout.vllm.gpu_memory_utilization = 0.5
    c.rollout.vllm.kv_cache_mb = 0  # 0: vLLM sizes its cache from gpu_memory_utilization
    c.rollout.vllm.max_num_seqs = 256
    c.rollout.group_size = 16
    c.rollout.batch_tasks = 8
    c.rollout.max_turns = 10
    c.rollout.max_new_tokens = 256
    c.rollout.max_context_tokens = 16384
    c.train.mode = "on_policy"
    c.learner.old_logprobs = "current"
    c.learner.freeze_vision = True
    c.learner.rows = 8
    c.loss.clip_eps_high = 0.2
    c.loss.dual_clip_c = 0.0
    c.loss.kl_coef = 1e-4
    c.loss.tis_cap = 2.0
    c.optimizer.learning_rate = 1e-6
    c.train.num_steps = 200
    c.train.checkpoint_every = 20
    c.eval.num_seeds = 16
    c.eval.max_turns = 15
    c.eval.max_context_tokens = 16384
    return c
