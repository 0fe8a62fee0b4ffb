"""Metric writers: JSON lines (one object per step) and TensorBoard, behind one call.

A run's metrics are the record researchers compare, so every value written is a plain
float, and non-finite values are kept (written as null in JSON) rather than dropped.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

# Metrics that measure wall-clock time: everything else is a function of the config and seed.
TIMING_PREFIX = "time/"


def _to_float(value: Any) -> float:
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(f"metric values must be scalars, got shape {arr.shape}")
    return float(arr.reshape(()))


class MetricWriter:
    """Writes scalar metrics per step to `<logdir>/metrics.jsonl` and TensorBoard.

    Usage:
        writer = MetricWriter("runs/x")
        writer.write(step, {"reward/mean": 0.4, "loss": 1.2})
        writer.close()
    """

    def __init__(self, logdir: str, tensorboard: bool = True):
        self.logdir = logdir
        os.makedirs(logdir, exist_ok=True)
        self.jsonl_path = os.path.join(logdir, "metrics.jsonl")
        self._jsonl = open(self.jsonl_path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(logdir=os.path.join(logdir, "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = {name: _to_float(value) for name, value in metrics.items()}
        record = {"step": int(step), "time": time.time()}
        record.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
        self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, global_step=int(step))

    def flush(self) -> None:
        self._jsonl.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self.flush()
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Reads a metrics.jsonl file back (nulls become NaN)."""
    records = []
    with open(path) as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_number}: not a JSON object: {e}") from e
            records.append({k: (math.nan if v is None else v) for k, v in record.items()})
    return records


def drop_records_from(path: str, step: int) -> None:
    """Removes the records of steps >= `step` from a JSON-lines metrics file (a resumed run
    repeats the steps after its checkpoint); a missing file is left missing."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [line for line in f if line.strip() and json.loads(line)["step"] < step]
    with open(path, "w") as f:
        f.writelines(lines)
