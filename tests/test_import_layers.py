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


def test_every_long_module_says_its_single_job():
    """A module of cua_jax over 600 lines opens with a `# Single job: ...` comment, so a long
    file is long because its one job is, not because several share it."""
    unexplained = []
    for path in sorted((ROOT / "cua_jax").rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > 600 and not lines[0].startswith("# Single job: "):
            unexplained.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert not unexplained, "long modules without a '# Single job:' first line: " + ", ".join(unexplained)
