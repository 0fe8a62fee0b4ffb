"""Export a trained run's policy as a Hugging Face directory:

    python -m experiments.export --workdir=RUN --out=DIR [--step=N] [--dtype=bfloat16]

Reads checkpoint N (default: the latest) under <RUN>/checkpoints, as the trainer's
`TrainCheckpointer` wrote it. Its `config` item is the run's config: it names the policy
(`build_policy`, built abstractly here for its structure) and where the run's tokenizer and
image processor come from (`ModelSettings.tokenizer_source`: model.tokenizer_dir, else model.init_from, else the
shipped pair). The policy's parameters (the `params` and `frozen` parts of the checkpoint's
train state; not the optimizer state) are restored onto the host CPU and written by
`cua_jax.models.hf_policy.export_policy` with that tokenizer, chat template and image processor.
The directory loads in transformers, vLLM and `cua_jax.models.hf_policy.load_policy`.
"""

from __future__ import annotations

import os
import pathlib

from absl import app, flags

from cua_jax.context.tokenizer import SHIPPED_TOKENIZER_DIR
from cua_jax.models.hf_policy import export_policy
from cua_jax.observe.logs import quiet_library_logging
from cua_jax.train.checkpoint import read_saved_config, resolve_step, restore_policy
from cua_jax.train.settings import TrainSettings, model_settings
from experiments.configs.base import config_from_dict

DTYPES = ("float32", "bfloat16")


def read_run_config(workdir: str | os.PathLike, step: int):
    """The run's config as the trainer saved it with checkpoint `step`, on today's base config
    (`config_from_dict`: renamed fields under their new names, fields added since the run keep
    their defaults)."""
    return config_from_dict(read_saved_config(workdir, step))


def export_run(workdir: str | os.PathLike, out: str | os.PathLike, step: int | None = None, dtype: str | None = None):
    """Exports the policy of checkpoint `step` (default the latest) of the run in `workdir` to
    `out` (which must not exist or be empty), with the run's tokenizer, chat template and image
    processor. Returns (step, the written directory's `PolicyDirectory`)."""
    out = pathlib.Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an empty directory; choose a new one")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not one of {DTYPES}")
    step = resolve_step(workdir, step)
    config = read_run_config(workdir, step)
    source = model_settings(config).tokenizer_source or SHIPPED_TOKENIZER_DIR
    if not pathlib.Path(source).is_dir():
        raise ValueError(
            f"the run's tokenizer directory {str(source)!r} (config.model.tokenizer_dir, else "
            "config.model.init_from) is not a directory"
        )
    model = restore_policy(workdir, step, TrainSettings.from_config(config))
    return step, export_policy(model, out, tokenizer=source, dtype=dtype)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    quiet_library_logging()
    FLAGS = flags.FLAGS
    try:
        step, policy = export_run(FLAGS.workdir, FLAGS.out, FLAGS.step, FLAGS.dtype)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    if policy is not None:  # the writing process
        print(
            f"exported step {step} of {FLAGS.workdir} to {policy.directory}: a {policy.architecture} with "
            f"{policy.vocab_size} vocabulary entries in {len(policy.safetensors)} safetensors file(s)"
        )


def define_flags() -> None:
    """The command line's flags (defined only when run as a program, so importing this module
    next to another entrypoint defining --workdir does not clash)."""
    flags.DEFINE_string("workdir", None, "The training run's directory (holds checkpoints/).", required=True)
    flags.DEFINE_string("out", None, "Directory to write the Hugging Face policy into (new or empty).", required=True)
    flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).")
    flags.DEFINE_enum("dtype", None, DTYPES, "On-disk dtype of the weights (default: the parameters' own).")


if __name__ == "__main__":
    define_flags()
    app.run(main)
