"""Processors' ``tensor_adapter`` and outlines' 1-D/2-D shape rules (ported with the code from the
h15 branch)."""
from __future__ import annotations

import numpy as np
import pytest
import torch


def test_processor_shape_rules_and_tensor_adapter() -> None:
    from tokenrails.compat.outlines.processors import OutlinesLogitsProcessor

    class Identity(OutlinesLogitsProcessor):
        def process_logits(self, input_ids, logits):
            assert len(self.tensor_adapter.shape(input_ids)) == 2 == len(self.tensor_adapter.shape(logits))
            return logits

    for lib, make in (("torch", torch.tensor), ("numpy", np.array)):
        p = Identity(lib)
        assert list(p(make([1, 2]), make([0.5, 1.0])).shape) == [2]
        assert list(p(make([1, 2]), make([[0.5, 1.0]])).shape) == [1, 2]
        with pytest.raises(AssertionError):
            p(make([[1, 2]]), make([0.5, 1.0]))
        with pytest.raises(AssertionError):
            p(make([1, 2]), make([[0.5, 1.0], [1.0, 2.0]]))
