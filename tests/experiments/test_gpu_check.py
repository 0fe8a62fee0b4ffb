"""experiments/gpu_check.py (the entry of launch/gpu_check.sh) on the CPU backend at its small
sizes: every check passes and reports platform cpu; failures and missing packages are reported
per check, with the exit status saying which."""

import json
import os
import subprocess
import sys

from experiments import gpu_check


def test_every_check_passes_on_cpu(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert gpu_check.main(["--small", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["platform"].startswith("platform cpu: 8 device(s)")
    assert [r["check"] for r in written["results"]] == list(gpu_check.CHECKS)
    assert {r["status"] for r in written["results"]} == {"PASS"}
    assert all(r["seconds"] > 0 for r in written["results"])
    table = capsys.readouterr().out
    assert "check            result  seconds" in table and "learner_bf16     PASS" in table


def test_a_failing_check_and_a_missing_package_are_reported(monkeypatch, capsys):
    def broken(small):
        gpu_check._require(False, "logits differ by 3.0")

    def crashing(small):
        raise RuntimeError("out of memory")

    monkeypatch.setitem(gpu_check.CHECK_FUNCTIONS, "parity_qwen3", (broken, ("numpy",)))
    monkeypatch.setitem(gpu_check.CHECK_FUNCTIONS, "sharding", (crashing, ("numpy",)))
    monkeypatch.setitem(gpu_check.CHECK_FUNCTIONS, "learner_bf16", (broken, ("numpy", "no_such_package_for_gpu_check")))
    results = gpu_check.run_checks(("parity_qwen3", "sharding", "learner_bf16"), small=True, log=lambda _: None)
    assert [(r.check, r.status) for r in results] == [
        ("parity_qwen3", "FAIL"),
        ("sharding", "FAIL"),
        ("learner_bf16", "MISSING"),
    ]
    assert results[0].detail == "logits differ by 3.0"
    assert results[1].detail == "RuntimeError: out of memory"
    assert results[2].detail == "missing package(s): no_such_package_for_gpu_check"
    assert gpu_check.main(["--checks", "learner_bf16"]) == 2
    assert gpu_check.main(["--checks", "parity_qwen3,learner_bf16"]) == 1
    capsys.readouterr()


def test_the_two_process_check_needs_an_even_count_of_gpus():
    """launch/gpu_check.sh --two-processes splits the GPUs in halves, one per process: with one
    (or an odd count) it stops at once with exit status 3. (JAX_PLATFORMS=cpu runs it on 4 CPU
    devices per process: a 2-update training run of minutes, run by hand.)"""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert subprocess.run(["bash", "-n", "launch/gpu_check.sh"], cwd=repo).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | {"CUA_JAX_PYTHON": sys.executable}
    for visible in ("0", "0,1,2"):
        run = subprocess.run(
            ["bash", "launch/gpu_check.sh", "--two-processes"],
            cwd=repo,
            env={**env, "CUDA_VISIBLE_DEVICES": visible},
            capture_output=True,
            text=True,
        )
        assert run.returncode == 3, run.stderr
        count = len(visible.split(","))
        assert f"needs an even count of 2 or more GPUs, this machine shows {count}" in run.stderr
