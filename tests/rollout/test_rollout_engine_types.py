"""The engine interface's records and the shared-memory weight buffer (no engine needed)."""

import os

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.rollout.engine import FinishReason, Generation, GenerationRequest, SamplingConfig
from cua_jax.rollout.vllm_engine import WeightSyncExtension, pack_shared_buffer


def test_requests_and_sampling_reject_bad_input():
    with pytest.raises(ValueError, match="non-empty 1-D"):
        GenerationRequest(np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="non-empty 1-D"):
        GenerationRequest(np.zeros((0,), np.int32))
    with pytest.raises(ValueError, match="integers"):
        GenerationRequest(np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="non-negative"):
        GenerationRequest(np.array([3, -1]))
    with pytest.raises(ValueError, match="uint8"):
        GenerationRequest(np.array([1]), images=[np.zeros((4, 4), np.uint8)])
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*31\), got -1"):
        GenerationRequest(np.array([1]), seed=-1)
    with pytest.raises(ValueError, match="seed must be in"):
        GenerationRequest(np.array([1]), seed=2**31)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(max_new_tokens=1, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(max_new_tokens=1, temperature=-1.0)
    with pytest.raises(ValueError, match="rope_scaling must be 0"):
        SamplingConfig(max_new_tokens=1, rope_scaling=1.0)  # a YaRN factor exceeds 1
    with pytest.raises(ValueError, match="equal-length"):
        Generation(np.zeros(3, np.int32), np.zeros(2, np.float32), FinishReason.STOP, 0)
    assert GenerationRequest([4, 5]).prompt_ids.dtype == np.int32


class _RecordingWorker(WeightSyncExtension):
    """The extension's transports, with vLLM's reload replaced by recording the tensors
    (the real reload is exercised in test_vllm_engine.py)."""

    def _cua_reload(self, weights):
        self.loaded = {name: tensor.clone() for name, tensor in weights}


shapes = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 7)), min_size=1, max_size=4)


@settings(max_examples=20, deadline=None)
@given(shapes=shapes, transpose=st.lists(st.booleans(), min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_shared_buffer_round_trips_in_hf_layout(shapes, transpose, seed):
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, ml_dtypes.bfloat16]
    entries = [
        (f"t{i}", rng.standard_normal(shape).astype(dtypes[i % 2]), transpose[i]) for i, shape in enumerate(shapes)
    ]
    path, manifest = pack_shared_buffer(entries, directory="/tmp")
    try:
        worker = _RecordingWorker()
        assert worker.cua_load_shared_buffer(path, manifest) == len(entries)
    finally:
        os.unlink(path)
    for name, array, t in entries:
        want = array.T if t else array
        got = worker.loaded[name]
        assert tuple(got.shape) == want.shape
        np.testing.assert_array_equal(got.float().numpy(), want.astype(np.float32))
        assert got.dtype == (torch.float32 if array.dtype == np.float32 else torch.bfloat16)


def test_dlpack_entries_are_wrapped_and_transposed():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    worker = _RecordingWorker()
    assert worker.cua_load_tensors([("a", array, True), ("b", array, False)]) == 2
    np.testing.assert_array_equal(worker.loaded["a"].numpy(), array.T)
    np.testing.assert_array_equal(worker.loaded["b"].numpy(), array)


def test_unsupported_dtype_is_named():
    with pytest.raises(ValueError, match="float64"):
        pack_shared_buffer([("x", np.zeros(3, np.float64), False)], directory="/tmp")
