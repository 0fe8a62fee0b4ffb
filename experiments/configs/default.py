"""The embedded default experiment.

Until the online trainer lands, the default job measures Visual Context Segmentation
(`experiments/benchmarks/segmentation.py`): how many items, tokens and how much attention
cost sliding-window segmentation saves against step-wise and whole-trajectory training.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.job = "segmentation_benchmark"
    config.workdir = "runs/default"
    return config
