"""Qwen3 model step: our JAX model vs transformers' PyTorch model, same process, same
config, same weights, same batch.

Prints tokens/s and the ratio (ours / transformers) for
  * forward + backward of the next-token cross-entropy (training step without optimizer);
  * greedy decoding: our KV-cache sampler vs transformers `generate`.

    python -m experiments.benchmarks.model_step [--batch 4 --seq 128 --new-tokens 64]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from cua_jax.models.checkpoint import export_qwen3
from cua_jax.models.configs import tiny_qwen3_config
from cua_jax.models.qwen3 import Qwen3ForCausalLM
from cua_jax.models.sampler import Sampler, SamplingParams


def best_time(fn, iters: int) -> float:
    """Seconds of the fastest of `iters` runs (after one warm-up run)."""
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args(argv)

    import transformers

    config = tiny_qwen3_config(
        hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
        vocab_size=args.vocab, num_attention_heads=args.hidden // 64, num_key_value_heads=max(1, args.hidden // 128),
    )
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    with tempfile.TemporaryDirectory() as directory:
        export_qwen3(model, directory, tokenizer_files=False)
        hf = transformers.Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    print(f"config: hidden {config.hidden_size}, layers {config.num_hidden_layers}, heads "
          f"{config.num_attention_heads}/{config.num_key_value_heads}, vocab {config.vocab_size}; "
          f"batch {args.batch} x seq {args.seq}; JAX on {jax.devices()[0].platform}, torch on cpu "
          f"({torch.get_num_threads()} threads)")

    ids = np.random.default_rng(0).integers(3, config.vocab_size, (args.batch, args.seq))

    # ---- forward + backward
    def loss_fn(m, ids):
        logits, _ = m(ids[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    grad_step = nnx.jit(nnx.value_and_grad(loss_fn))
    jax_ids = jnp.asarray(ids)
    ours_s = best_time(lambda: jax.block_until_ready(grad_step(model, jax_ids)), args.iters)

    hf.train()
    torch_ids = torch.as_tensor(ids)

    def torch_step():
        hf.zero_grad(set_to_none=True)
        out = hf(torch_ids, labels=torch_ids)
        out.loss.backward()

    hf_s = best_time(torch_step, args.iters)
    tokens = args.batch * (args.seq - 1)
    print(f"forward+backward tokens/s: ours {tokens / ours_s:,.0f}  transformers {tokens / hf_s:,.0f}  "
          f"ratio {hf_s / ours_s:.2f}x")

    # ---- greedy decode
    hf.eval()
    prompt_len = 32
    prompts = [list(map(int, row[:prompt_len])) for row in ids]
    sampler = Sampler(model, prompt_buckets=(prompt_len,), batch_buckets=(args.batch,), new_token_buckets=(args.new_tokens,))
    params = SamplingParams(temperature=0, max_new_tokens=args.new_tokens)
    ours_s = best_time(lambda: sampler.generate(prompts, params, jax.random.key(0)), args.iters)
    prompt_tensor = torch.as_tensor([p for p in prompts])

    def torch_generate():
        with torch.no_grad():
            hf.generate(prompt_tensor, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                        do_sample=False, eos_token_id=None, pad_token_id=0)

    hf_s = best_time(torch_generate, args.iters)
    new = args.batch * args.new_tokens
    print(f"decode tokens/s (prefill {prompt_len} + {args.new_tokens} new, batch {args.batch}): ours {new / ours_s:,.0f}  "
          f"transformers {new / hf_s:,.0f}  ratio {hf_s / ours_s:.2f}x")


if __name__ == "__main__":
    main()
