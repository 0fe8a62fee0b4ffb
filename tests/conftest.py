"""Suite-wide test configuration.

Eight host devices let the sharding tests build real meshes on one CPU. The flag must be
set before JAX initialises its backend, which is why it lives here and not in a test.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
