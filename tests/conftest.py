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


# Every compiled XLA program keeps its machine code in memory maps of its own (about 50 for a small
# program, hundreds for a model's), and JAX keeps every program a test compiled for the life of
# the process. One process running the whole suite would pass the kernel's vm.max_map_count
# (65,530 by default) near its end, where the next program's code can no longer be mapped and
# the process dies of a segmentation fault. So between test modules, once the maps pass half
# the limit, JAX's caches are cleared: what the next tests need compiles again (or loads from
# the persistent cache above).
def _memory_maps() -> int:
    with open("/proc/self/maps", "rb") as maps:
        return maps.read().count(b"\n")


def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except OSError:  # not Linux: no per-process map limit to keep under
        return 0


_MAP_LIMIT = _map_limit()


def pytest_runtest_teardown(item, nextitem):
    if not _MAP_LIMIT or (nextitem is not None and nextitem.module is item.module):
        return
    maps = _memory_maps()
    if maps > _MAP_LIMIT // 2:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        capture = item.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():  # teardown's output is captured otherwise
                reporter.ensure_newline()
                reporter.write_line(
                    f"[conftest] {maps} memory maps after {item.nodeid.split('::')[0]} (the limit is "
                    f"{_MAP_LIMIT}): JAX's compiled programs cleared, {_memory_maps()} maps left"
                )
