"""Weight sync into vLLM vs model size, and vLLM vs JAX-sampler decode speed.

    python -m experiments.benchmarks.weight_sync [--sizes tiny,small,medium] [--new_tokens 64]

For each model size: a random Qwen3 is written by our exporter, a vLLM engine serves it,
and the script times (a) `update_weights` from the JAX model's state through the
shared-memory transport (median of a few syncs; the JAX->host copy included; "pack s"
is the transport alone, the rest is vLLM's in-place reload and re-packing) and
(b) greedy decoding of the same batch by vLLM and by our JAX sampler (after a warm-up
call each, so compilation is excluded), printing tokens/s and the ratio vLLM / JAX.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

SIZES = {
    # name: (hidden, intermediate, layers, heads, kv heads); head_dim 64, vocab 4096
    "tiny": (128, 256, 2, 4, 2),
    "small": (512, 1024, 4, 8, 4),
    "medium": (1024, 2816, 8, 16, 8),
}


def build_model(name: str):
    from flax import nnx

    from cua_jax.context.tokenizer import VOCAB_SIZE
    from cua_jax.models.qwen3 import Qwen3ForCausalLM, tiny_qwen3_config

    hidden, inter, layers, heads, kv = SIZES[name]
    config = tiny_qwen3_config(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=64,
    )
    return Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))


def run_size(name: str, new_tokens: int, batch: int, syncs: int) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from cua_jax.models.qwen3 import export_qwen3
    from cua_jax.rollout.engine import GenerationRequest, SamplingConfig
    from cua_jax.rollout.jax_engine import JaxSamplerEngine
    from cua_jax.rollout.vllm_engine import (
        VllmEngine,
        VllmEngineConfig,
        hf_weight_entries,
        key_table_for_directory,
        pack_shared_buffer,
    )

    model = build_model(name)
    state = nnx.state(model)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))
    rng = np.random.default_rng(0)
    requests = [GenerationRequest(rng.integers(10, 3000, size=16)) for _ in range(batch)]
    # Never stop early: both engines decode exactly new_tokens per request.
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=0.0)

    with tempfile.TemporaryDirectory() as directory:
        export_qwen3(model, directory)
        engine = VllmEngine(VllmEngineConfig(directory, max_model_len=256, kv_cache_bytes=256 * 1024**2))
        try:
            # The transport alone: JAX -> host -> one /dev/shm file in HF layout.
            entries = hf_weight_entries(state, key_table_for_directory(directory))
            pack_times = []
            for _ in range(syncs):
                start = time.perf_counter()
                path, _ = pack_shared_buffer(entries)
                pack_times.append(time.perf_counter() - start)
                os.unlink(path)
            times = []
            for version in range(1, syncs + 1):
                start = time.perf_counter()
                engine.update_weights(state, version)
                times.append(time.perf_counter() - start)
            engine.generate(requests[:1], SamplingConfig(max_new_tokens=4, temperature=0.0))
            start = time.perf_counter()
            vllm_out = engine.generate(requests, sampling)
            vllm_s = time.perf_counter() - start
        finally:
            engine.close()

    jax_engine = JaxSamplerEngine(model)
    jax_engine.generate(requests, sampling)  # compile
    start = time.perf_counter()
    jax_out = jax_engine.generate(requests, sampling)
    jax_s = time.perf_counter() - start
    tokens = sum(len(g.token_ids) for g in vllm_out)
    same = all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(vllm_out, jax_out))
    return dict(
        name=name,
        params_m=n_params / 1e6,
        mbytes=n_params * 4 / 1e6,
        sync_s=statistics.median(times),
        pack_s=statistics.median(pack_times),
        vllm_tps=tokens / vllm_s,
        jax_tps=sum(len(g.token_ids) for g in jax_out) / jax_s,
        same_tokens=same,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small,medium")
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--syncs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    rows = [run_size(name, args.new_tokens, args.batch, args.syncs) for name in args.sizes.split(",")]
    print(
        f"\nweight sync (shared-memory transport, float32) and greedy decode, batch {args.batch}, "
        f"{args.new_tokens} new tokens"
    )
    print(
        f"{'model':<8}{'params':>10}{'MB':>9}{'sync s':>9}{'pack s':>9}{'sync MB/s':>11}"
        f"{'vLLM tok/s':>12}{'JAX tok/s':>11}{'vLLM/JAX':>10}{'same ids':>10}"
    )
    for r in rows:
        print(
            f"{r['name']:<8}{r['params_m']:>9.2f}M{r['mbytes']:>9.1f}{r['sync_s']:>9.3f}{r['pack_s']:>9.3f}"
            f"{r['mbytes'] / r['sync_s']:>11.0f}{r['vllm_tps']:>12.1f}{r['jax_tps']:>11.1f}"
            f"{r['vllm_tps'] / r['jax_tps']:>10.2f}{str(r['same_tokens']):>10}"
        )


if __name__ == "__main__":
    main()
