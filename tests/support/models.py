"""Small model shapes several tests build."""

# `tiny_qwen3_config` overrides for one decoder layer, every sharded dimension divisible by
# fsdp 4 x tensor 2.
SMALL_QWEN3 = dict(
    num_hidden_layers=1,
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
)
