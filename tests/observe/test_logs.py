"""The run's console filter: its own INFO lines pass, libraries' only from WARNING up."""

from __future__ import annotations

import io
import logging

from absl import logging as absl_logging

from cua_jax.observe import logs


def _record(path: str, level: int) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"pathname": path, "levelno": level, "levelname": logging.getLevelName(level), "msg": "m"}
    )


def test_own_info_passes_library_info_does_not(tmp_path):
    own = tmp_path / "own"
    keep = logs.OwnInfoFilter([str(own)])
    assert keep.filter(_record(str(own / "pkg" / "a.py"), logging.INFO))
    assert keep.filter(_record(str(own / "a.py"), logging.DEBUG))
    library = str(tmp_path / "site-packages" / "orbax" / "checkpoint_manager.py")
    assert not keep.filter(_record(library, logging.INFO))
    assert keep.filter(_record(library, logging.WARNING))
    assert keep.filter(_record(library, logging.ERROR))
    # A sibling directory whose name starts with the root's is not under it.
    assert not keep.filter(_record(str(tmp_path / "own_other" / "a.py"), logging.INFO))


def test_default_roots_are_this_checkouts_packages():
    keep = logs.OwnInfoFilter()
    assert keep.filter(_record(logs.__file__, logging.INFO))
    assert not keep.filter(_record(absl_logging.__file__, logging.INFO))


def test_installed_on_absl_handler_once_and_filters_absl_records(tmp_path):
    handler = absl_logging.get_absl_handler()
    before = list(handler.filters)
    try:
        logs.quiet_library_logging()
        logs.quiet_library_logging()
        assert sum(isinstance(f, logs.OwnInfoFilter) for f in handler.filters) == 1
        # A library file logging through absl, and this test file (not under the roots either).
        library = tmp_path / "library.py"
        library.write_text(
            "from absl import logging\n\ndef talk():\n    logging.info('library info')\n"
            "    logging.warning('library warning')\n"
        )
        namespace: dict = {}
        exec(compile(library.read_text(), str(library), "exec"), namespace)
        stream = io.StringIO()
        capture = logging.StreamHandler(stream)
        for f in handler.filters:
            capture.addFilter(f)
        root = logging.getLogger()
        root.addHandler(capture)
        level = absl_logging.get_verbosity()
        absl_logging.set_verbosity(absl_logging.INFO)
        try:
            namespace["talk"]()
        finally:
            absl_logging.set_verbosity(level)
            root.removeHandler(capture)
        assert "library warning" in stream.getvalue() and "library info" not in stream.getvalue()
    finally:
        for f in list(handler.filters):
            if f not in before:
                handler.removeFilter(f)
