"""Suite-wide test configuration.

Eight host devices let the sharding tests build real meshes on one CPU. The flag must be
set before JAX initialises its backend, which is why it lives here and not in a test.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Compiled programs kept between test runs on this machine (JAX's persistent compilation cache,
# `cua_jax.compilation`, in the directory runs use: experiments/configs/base.py's
# compilation_cache_dir): a rerun of the suite skips compiling what the last run compiled. A fresh
# machine compiles everything once. CUA_JAX_TEST_COMPILATION_CACHE="" turns it off.
_compilation_cache = os.environ.get("CUA_JAX_TEST_COMPILATION_CACHE", "~/.cache/cua_jax/xla")
if _compilation_cache:
    from cua_jax.compilation import use_compilation_cache

    use_compilation_cache(_compilation_cache)
