"""The layer contract in .importlinter holds: no module imports from a layer above its own
(function-level imports included)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_no_module_imports_from_a_layer_above_it():
    lint_imports = pathlib.Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache", "--config", str(ROOT / ".importlinter")],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
