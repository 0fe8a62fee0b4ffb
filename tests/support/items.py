"""Comparing training items."""

import numpy as np


def assert_items_equal(left, right):
    """Two lists of TrainingItems hold the same tokens, masks, logprobs, images and turns."""
    assert len(left) == len(right)
    for a, b in zip(left, right):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
        np.testing.assert_array_equal(a.rollout_logprobs, b.rollout_logprobs)
        assert a.images == b.images and a.step_indices == b.step_indices
