"""Multi-host for real: two processes with 4 CPU devices each, joined through jax.distributed
(gloo CPU collectives) by launch/multihost.sh, against one process with 8 devices, both on a
data 2 x fsdp 2 x tensor 2 mesh (tests/launch/multihost_step.py does the work)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from cua_jax.models.sharding import MeshConfig
from cua_jax.train.settings import ConfigError, TrainSettings, mesh_settings
from experiments.configs import tiny
from experiments.configs.base import base_config
from tests.launch.conftest import REPO, free_port, process_env

STEP = "tests/launch/multihost_step.py"
MESH_FLAGS = [
    "--config=experiments/configs/tiny.py",
    "--config.mesh.data=2",
    "--config.mesh.fsdp=2",
    "--config.mesh.tensor=2",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(single-process output dir, two-process output dir), run side by side."""
    single, double = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("double")
    coordinator = f"127.0.0.1:{free_port()}"
    processes = [
        subprocess.Popen(
            [sys.executable, STEP, *MESH_FLAGS, f"--out={single}"],
            cwd=REPO,
            env=process_env(8),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    ]
    for process_id in range(2):
        env = process_env(
            4,
            CUA_PROCESS_ID=str(process_id),
            CUA_NUM_PROCESSES="2",
            CUA_COORDINATOR_ADDRESS=coordinator,
            CUA_MULTIHOST_PROGRAM=STEP,
        )
        processes.append(
            subprocess.Popen(
                ["bash", "launch/multihost.sh", *MESH_FLAGS, f"--out={double}"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        for process in processes:
            out, _ = process.communicate(timeout=240)
            assert process.returncode == 0, out[-4000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return single, double


def test_two_processes_train_as_one_process_with_eight_devices(runs):
    single, double = runs
    reference = np.load(single / "result_0.npz")
    results = [np.load(double / f"result_{p}.npz") for p in range(2)]
    np.testing.assert_array_equal(reference["devices"], [8, 8, 1])
    for _p, result in enumerate(results):
        np.testing.assert_array_equal(result["devices"], [8, 4, 2])  # 8 global devices, 4 on this host
        # The same two updates: equal up to the order of float32 reductions across hosts.
        for key in ("metric/loss", "metric/grad_norm", "metric/entropy"):
            np.testing.assert_allclose(result[key], reference[key], rtol=1e-6, err_msg=key)
        params = [k for k in reference.files if k.startswith("param/")]
        assert len(params) > 5
        for key in params:
            np.testing.assert_allclose(result[key], reference[key], rtol=1e-6, atol=1e-6, err_msg=key)
            np.testing.assert_array_equal(result[key], results[0][key])  # every host gathers the same
    assert not np.allclose(results[0]["metric/loss"][0], results[0]["metric/loss"][1])  # the step moved the policy


def test_orbax_checkpoint_saved_and_restored_across_the_processes(runs):
    _, double = runs
    for p in range(2):
        result = np.load(double / f"result_{p}.npz")
        assert int(result["restored_step"]) == 2
        for key in (k for k in result.files if k.startswith("param/")):
            np.testing.assert_array_equal(result[key.replace("param/", "restored/")], result[key], err_msg=key)


def test_export_gathers_the_sharded_parameters_on_process_zero(runs):
    single, double = runs
    exported = load_file(double / "export" / "model.safetensors")
    reference = load_file(single / "export" / "model.safetensors")
    assert sorted(exported) == sorted(reference)
    for name, array in exported.items():
        np.testing.assert_allclose(array, reference[name], rtol=1e-6, atol=1e-6, err_msg=name)
    result = np.load(double / "result_0.npz")
    embed = next(k for k in result.files if k.startswith("param/") and "embed_tokens" in k)
    np.testing.assert_array_equal(exported["model.embed_tokens.weight"], result[embed])


def test_mesh_fields_reach_the_mesh_config_and_bad_ones_are_named():
    c = base_config()
    assert mesh_settings(c) == MeshConfig(data=1, fsdp=1, tensor=1)
    c.mesh.distributed, c.mesh.coordinator_address, c.mesh.num_processes, c.mesh.process_id = True, "h:1234", 4, 3
    assert mesh_settings(c) == MeshConfig(
        data=1, fsdp=1, tensor=1, distributed=True, coordinator_address="h:1234", num_processes=4, process_id=3
    )
    c.mesh.process_id = 4
    with pytest.raises(ConfigError, match=r"config.mesh.process_id: process_id 4 is not in \[0, num_processes=4\)"):
        mesh_settings(c)
    c.mesh.process_id, c.mesh.coordinator_address = 0, "nohostport"
    with pytest.raises(ConfigError, match="config.mesh.coordinator_address: coordinator_address must be host:port"):
        mesh_settings(c)
    c.mesh.coordinator_address, c.mesh.distributed = "h:1", False
    with pytest.raises(ConfigError, match="config.mesh.distributed: distributed is False"):
        mesh_settings(c)
    c.mesh.distributed, c.mesh.heartbeat_timeout_s = True, 30
    assert mesh_settings(c).heartbeat_timeout_s == 30
    c.mesh.heartbeat_timeout_s = 0.5
    with pytest.raises(ConfigError, match="config.mesh.heartbeat_timeout_s: heartbeat_timeout_s must be a number of"):
        mesh_settings(c)


def test_multihost_script_takes_process_id_and_count_from_slurm(tmp_path):
    """Under SLURM the script passes SLURM_PROCID / SLURM_NTASKS on as the mesh fields (the
    program here prints the arguments it gets), and makes the run a coordinated one right after
    --config, where a later flag of the caller's still overrides it."""
    program = tmp_path / "print_args.py"
    program.write_text("import sys\nprint('\\n'.join(sys.argv[1:]))\n")
    env = process_env(
        1, SLURM_PROCID="3", SLURM_NTASKS="4", CUA_COORDINATOR_ADDRESS="node-a:8476", CUA_MULTIHOST_PROGRAM=str(program)
    )
    for name in ("CUA_PROCESS_ID", "CUA_NUM_PROCESSES"):
        env.pop(name, None)

    def args(*given):
        return subprocess.run(
            ["bash", "launch/multihost.sh", *given], cwd=REPO, env=env, capture_output=True, text=True, check=True
        ).stdout.split()

    mesh = [
        "--config.mesh.distributed=true",
        "--config.mesh.coordinator_address=node-a:8476",
        "--config.mesh.num_processes=4",
        "--config.mesh.process_id=3",
    ]
    assert args("--config=experiments/configs/tiny.py") == [
        "--config=experiments/configs/tiny.py",
        "--config.train.coordinated=true",
        *mesh,
    ]
    given = ["--resume", "--config", "experiments/configs/tiny.py", "--config.train.coordinated=false", "--workdir=w"]
    assert args(*given) == [*given[:3], "--config.train.coordinated=true", *given[3:], *mesh]
    assert args("--workdir=w") == ["--config.train.coordinated=true", "--workdir=w", *mesh]  # the default config
    assert subprocess.run(["bash", "-n", "launch/slurm_multihost.sbatch"], cwd=REPO).returncode == 0


def test_the_coordinated_flag_placed_by_the_script_is_overridden_by_a_later_one(tmp_path):
    """What the script relies on: ml_collections applies --config.x overrides in order after
    --config (an override before --config is an error)."""
    program = tmp_path / "print_coordinated.py"
    program.write_text(
        "from absl import app\nfrom ml_collections import config_flags\n"
        "CONFIG = config_flags.DEFINE_config_file('config', None, '')\n"
        "app.run(lambda argv: print(CONFIG.value.train.coordinated))\n"
    )

    def coordinated(*overrides):
        command = [sys.executable, str(program), "--config=experiments/configs/tiny.py", *overrides]
        done = subprocess.run(command, cwd=REPO, env=process_env(1), capture_output=True, text=True, check=True)
        return done.stdout.strip()

    assert coordinated("--config.train.coordinated=true") == "True"
    assert coordinated("--config.train.coordinated=true", "--config.train.coordinated=false") == "False"


def test_a_run_of_several_processes_must_be_coordinated():
    """Without train.coordinated every process would generate with parameters sharded over all of
    them, in batches its own browsers' timing decides: refused, naming the field."""
    c = tiny.get_config()
    c.model.name, c.env.observation, c.env.include_dom_text, c.rollout.seed_per_turn = "tiny_qwen3", "text", True, True
    c.mesh.distributed, c.mesh.coordinator_address, c.mesh.num_processes, c.mesh.process_id = True, "h:1234", 2, 0
    with pytest.raises(ConfigError, match=r"config.train.coordinated: a run of 2 processes must set it True"):
        TrainSettings.from_config(c)
    c.train.coordinated = True
    assert TrainSettings.from_config(c).train.coordinated
