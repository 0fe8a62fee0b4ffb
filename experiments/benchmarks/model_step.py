"""Qwen3 / Qwen3.5 model step: our JAX model vs transformers' PyTorch model, same process,
same config, same weights, same batch, float32, the same number of threads on both sides.
--model qwen3_5 runs the hybrid Qwen3.5 text model (3 Gated DeltaNet layers per gated
full-attention layer) against transformers' `Qwen3_5ForCausalLM` (its PyTorch fallbacks for
the delta rule and the causal conv: the fused kernels are CUDA-only).

Prints tokens/s and the ratio (ours / transformers) for
  * forward + backward of the token-mean next-token NLL over the same tokens (a training
    step without the optimizer). Ours is the Learner's own scoring path (state split once
    outside the jitted pure function, `score_sequences` with the learner's chunking);
    transformers runs eagerly and, where it works, under torch.compile;
  * for information: the Learner's full update (`Learner.update`: reference scoring for the
    KL term, clipped policy loss with k3 KL, gradient, AdamW) on items of realistic, varied
    lengths (second half of each trained), in real (unpadded) tokens/s;
  * greedy decoding: our KV-cache sampler vs transformers `generate`.

Both default sizes run (hidden 256 / 4 layers / batch 4 x 128 and hidden 512 / 8 layers /
batch 4 x 256) unless --hidden is given. Timings are the best of --iters runs after warm-up.

--profile traces our forward+backward with JAX's profiler and prints where the time goes:
the share of matmuls, layout copies (transposes) and other ops, and the top ops by time
with their shapes and source. What it showed here (2 threads, nothing else running):
  * before: hidden 256 / 4 layers 84 ms per step: matmuls 57%, layout copies 23%,
    other 20%. The largest copies (2.7 ms each, one per layer) were the SwiGLU
    backward's [768, 512] gradient written transposed for the weight-gradient dot of a
    3-D [B, T, E] projection; attention's grouped-head einsums added more.
  * projections as 2-D matmuls (`cua_jax.models.layers.project`): 74 ms, copies 11%;
    fwd+bwd 1.02x -> 1.21x eager at hidden 256 and 1.12x -> 1.42x at hidden 512.
  * `jax.nn.dot_product_attention` instead of the einsum attention: 74 -> 71 ms at
    hidden 256, 698 -> 665 ms at hidden 512. What remains is matmul-bound: the LM head
    and its input gradient (8.7 of 71 ms), the projections at 180-290 GFLOP/s, then the
    vocabulary softmax's exp and one-hot gradient (3.2 ms). XLA CPU flags (the YNNPACK,
    XNNPACK and oneDNN dot paths, the concurrency-optimised scheduler, the legacy
    fusion emitters) each measured within 5% of the default, none faster.

    python -m experiments.benchmarks.model_step [--model qwen3_5] [--threads 2]
        [--hidden 256 --layers 4 --batch 4 --seq 128] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from cua_jax.models.qwen3 import tiny_qwen3_config
from cua_jax.models.sampler import Sampler, SamplingParams

# (hidden, layers, batch, seq) of the default runs.
SIZES = ((256, 4, 4, 128), (512, 8, 4, 256))


def best_time(fn, iters: int, warmup: int = 2) -> float:
    """Seconds of the fastest of `iters` runs (after `warmup` runs)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def set_threads(threads: int | None) -> int:
    """Pins the process to `threads` CPUs (XLA sizes its CPU thread pool from the affinity
    mask when its backend starts) and gives torch as many intra-op threads. Call before the
    first JAX computation. Returns the thread count."""
    cpus = sorted(os.sched_getaffinity(0))
    if threads is not None:
        if threads > len(cpus):
            raise ValueError(f"--threads {threads}: only {len(cpus)} CPUs are available")
        cpus = cpus[:threads]
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    return len(cpus)


def qwen3_config(shape: dict):
    return tiny_qwen3_config(**shape)


def qwen3_5_config(shape: dict):
    from cua_jax.models.qwen3_5 import tiny_qwen3_5_text_config

    hidden = shape["hidden_size"]
    # Qwen3.5's proportions: head_dim 64 with rotary on a quarter, value heads twice the key heads.
    return tiny_qwen3_5_text_config(
        **shape,
        head_dim=64,
        mrope_section=(4, 2, 2),
        layer_types=(),
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=max(1, hidden // 128),
        linear_num_value_heads=hidden // 64,
    )


# --model -> the benchmark's config of that size.
BENCHMARK_CONFIGS = {"qwen3": qwen3_config, "qwen3_5": qwen3_5_config}


def make_config(hidden: int, layers: int, vocab: int, model: str = "qwen3"):
    shape = dict(
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        vocab_size=vocab,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
    )
    return BENCHMARK_CONFIGS[model](shape)


def model_kind(config):
    """(our model class, export function, transformers class) for a config."""
    import transformers

    from cua_jax.models.registry import model_kind_of_config

    kind = model_kind_of_config(config)
    return kind.model_class, kind.export, getattr(transformers, kind.architecture)


def profile_step(step, args, runs: int = 10, top: int = 15) -> None:
    """Traces `runs` calls of the jitted `step(*args)` with JAX's profiler and prints the
    time per step by kind of op (matmul, layout copy, other) and the `top` ops, each with
    its shape and the source operation XLA's metadata names."""
    hlo = step.lower(*args).compile().as_text()
    ops = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r'^\s*(?:ROOT )?%([\w.\-]+) = (\S+) [^\n]*?op_name="([^"]*)"', hlo, re.M)
    }
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            for _ in range(runs):
                jax.block_until_ready(step(*args))
        with gzip.open(glob.glob(f"{directory}/**/*.trace.json.gz", recursive=True)[0]) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ms = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and event["name"] in ops:
            ms[event["name"]] += event["dur"] / runs / 1e3
    kinds = collections.Counter()
    for name, t in ms.items():
        kinds[
            "matmul"
            if name.startswith(("ynn_fusion", "xnn_fusion", "dot"))
            else "layout copy"
            if "copy" in name or "transpose" in name
            else "other"
        ] += t
    total = sum(kinds.values())
    print(
        f"  profile of our forward+backward: {total:.1f} ms of ops per step: "
        + ", ".join(f"{kind} {t / total:.0%}" for kind, t in kinds.most_common())
    )
    for name, t in ms.most_common(top):
        shape, source = ops[name]
        print(f"    {t:6.2f} ms  {name:28s} {shape:30s} {source[:80]}")


def forward_backward(config, ids: np.ndarray, iters: int, compile_torch: bool, profile: bool = False) -> None:
    """Token-mean NLL of ids[:, 1:] given ids[:, :-1], forward + backward, both sides."""
    from cua_jax.train.learner import Learner, LearnerConfig

    model_cls, export, hf_cls = model_kind(config)
    learner = Learner(model_cls(config, rngs=nnx.Rngs(0)), LearnerConfig())
    with tempfile.TemporaryDirectory() as directory:
        export(learner.model, directory, tokenizer_files=False)
        hf = hf_cls.from_pretrained(directory, dtype=torch.float32)
    b, t = ids.shape
    tokens = b * (t - 1)

    def nll(params, frozen, batch):
        logp = learner._logprobs(params, frozen, batch)[0]  # [B, T], 0 at position 0
        return -jnp.sum(logp) / tokens

    batch = _nll_batch(ids)
    grad_step = jax.jit(jax.value_and_grad(nll))
    ours_loss, _ = grad_step(learner.params, learner.frozen, batch)
    ours_s = best_time(lambda: jax.block_until_ready(grad_step(learner.params, learner.frozen, batch)), iters)
    if profile:
        profile_step(grad_step, (learner.params, learner.frozen, batch))

    hf.train()
    torch_ids = torch.as_tensor(ids)

    def torch_loss(module):
        logits = module(torch_ids[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch_ids[:, 1:].reshape(-1))

    def torch_step(module):
        hf.zero_grad(set_to_none=True)
        loss = torch_loss(module)
        loss.backward()
        return loss.detach()

    hf_loss = float(torch_step(hf))
    hf_s = best_time(lambda: torch_step(hf), iters)
    print(
        f"  forward+backward tokens/s (token-mean NLL, loss ours {float(ours_loss):.4f} / torch {hf_loss:.4f}): "
        f"ours {tokens / ours_s:,.0f}  transformers eager {tokens / hf_s:,.0f}  ratio {hf_s / ours_s:.2f}x"
    )
    if compile_torch:
        try:
            compiled = torch.compile(hf)
            torch_step(compiled)
            compiled_s = best_time(lambda: torch_step(compiled), iters)
            print(
                f"  forward+backward tokens/s: transformers torch.compile {tokens / compiled_s:,.0f}  "
                f"ratio ours / compiled {compiled_s / ours_s:.2f}x"
            )
        except Exception as error:  # noqa: BLE001 - inductor needs a working C++ toolchain, absent on some CPU builds
            print(f"  torch.compile: does not work here ({type(error).__name__}: {str(error).splitlines()[0][:160]})")


def _nll_batch(ids: np.ndarray):
    """A TrainBatch holding ids as unpacked, unpadded rows (the learner's scoring input)."""
    from cua_jax.train.batching import TrainBatch

    b, t = ids.shape
    zeros = jnp.zeros((b, t), jnp.float32)
    return TrainBatch(
        ids=jnp.asarray(ids, jnp.int32),
        segment_ids=jnp.ones((b, t), jnp.int32),
        positions=jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
        loss_mask=jnp.ones((b, t), jnp.float32),
        rollout_logprobs=zeros,
        advantages=zeros,
        item_valid=jnp.ones((b,), bool),
    )


def learner_update(config, rows: int, seq: int, iters: int) -> None:
    """Learner.update on fresh micro-batches: reference scoring + policy loss with KL + AdamW."""
    from cua_jax.rl.losses import PolicyLossConfig
    from cua_jax.train.batching import BatchingConfig, collate
    from cua_jax.train.learner import Learner, LearnerConfig, OptimizerConfig
    from cua_jax.types import TrainingItem

    learner = Learner(
        model_kind(config)[0](config, rngs=nnx.Rngs(0)),
        LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-5), loss=PolicyLossConfig(kl_coef=1e-2)),
    )
    rng = np.random.default_rng(1)
    batching = BatchingConfig(rows=rows, length_multiple=64)

    def fresh_batch():
        items = []
        for k in range(rows):
            n = int(rng.integers(seq // 2, seq + 1))
            mask = np.zeros(n, np.int32)
            mask[n // 2 :] = 1
            logp = np.where(mask > 0, rng.uniform(-9.0, -7.0, n), 0.0).astype(np.float32)
            items.append(
                TrainingItem(
                    rng.integers(3, config.vocab_size, n).astype(np.int32), mask, logp, [], f"ep{k}", k // 2, (0,)
                )
            )
        advantages = rng.normal(size=rows).astype(np.float32)
        return [collate(items, advantages, batching, length=seq)], sum(len(i) for i in items)

    batches = [fresh_batch() for _ in range(iters + 2)]
    times = []
    for i, (micro, _) in enumerate(batches):
        start = time.perf_counter()
        learner.update(micro)  # returns host floats: synchronous
        if i >= 2:
            times.append(time.perf_counter() - start)
    tokens = np.mean([n for _, n in batches])
    print(
        f"  learner update tokens/s (reference scoring + policy loss with KL + AdamW, {rows} rows of "
        f"{seq // 2}..{seq} real tokens padded to {seq}): ours {tokens / min(times):,.0f}"
    )


def decode(config, ids: np.ndarray, new_tokens: int, iters: int) -> None:
    model_cls, export, hf_cls = model_kind(config)
    model = model_cls(config, rngs=nnx.Rngs(0))
    with tempfile.TemporaryDirectory() as directory:
        export(model, directory, tokenizer_files=False)
        hf = hf_cls.from_pretrained(directory, dtype=torch.float32)
    hf.eval()
    batch = ids.shape[0]
    prompt_len = 32
    prompts = [list(map(int, row[:prompt_len])) for row in ids]
    sampler = Sampler(model, prompt_buckets=(prompt_len,), batch_buckets=(batch,), new_token_buckets=(new_tokens,))
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    ours_s = best_time(lambda: sampler.generate(prompts, params, jax.random.key(0)), iters, warmup=1)
    prompt_tensor = torch.as_tensor(prompts)

    def torch_generate():
        with torch.no_grad():
            hf.generate(
                prompt_tensor,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )

    hf_s = best_time(torch_generate, iters, warmup=1)
    new = batch * new_tokens
    print(
        f"  decode tokens/s (prefill {prompt_len} + {new_tokens} new, batch {batch}): ours {new / ours_s:,.0f}  "
        f"transformers {new / hf_s:,.0f}  ratio {hf_s / ours_s:.2f}x"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=tuple(BENCHMARK_CONFIGS), default="qwen3")
    parser.add_argument("--batch", type=int, default=None, help="with --hidden: rows (default 4)")
    parser.add_argument("--seq", type=int, default=None, help="with --hidden: tokens per row (default 128)")
    parser.add_argument("--hidden", type=int, default=None, help="one custom size instead of the defaults")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPUs for both sides (default: all available)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding row")
    parser.add_argument("--no-update", action="store_true", help="skip the learner-update row")
    parser.add_argument("--profile", action="store_true", help="profile our forward+backward (module doc)")
    args = parser.parse_args(argv)

    threads = set_threads(args.threads)
    if args.hidden is not None:
        sizes = ((args.hidden, args.layers, args.batch or 4, args.seq or 128),)
    else:
        sizes = SIZES
    print(
        f"threads: torch intra-op {torch.get_num_threads()} (interop {torch.get_num_interop_threads()}), "
        f"XLA CPU pool over {threads} pinned CPUs; JAX {jax.__version__} on {jax.devices()[0].platform}, "
        f"torch {torch.__version__}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; float32 both sides"
    )
    for hidden, layers, batch, seq in sizes:
        config = make_config(hidden, layers, args.vocab, args.model)
        print(
            f"config: {args.model}, hidden {config.hidden_size}, layers {config.num_hidden_layers}, heads "
            f"{config.num_attention_heads}/{config.num_key_value_heads}, vocab {config.vocab_size}; "
            f"batch {batch} x seq {seq}"
        )
        ids = np.random.default_rng(0).integers(3, config.vocab_size, (batch, seq))
        forward_backward(config, ids, args.iters, compile_torch=not args.no_compile, profile=args.profile)
        if not args.no_update:
            learner_update(config, batch, seq, args.iters)
        if not args.no_decode:
            decode(config, ids, args.new_tokens, args.iters)


if __name__ == "__main__":
    main()
