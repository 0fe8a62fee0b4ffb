"""experiments/gpu_check.py (the entry of launch/gpu_check.sh) on the CPU backend at its small
sizes: every check passes and reports platform cpu; failures and missing packages are reported
per check, with the exit status saying which."""

import json

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
