"""Dynamic-sampling filters on real verl rows (DataProto)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl import DataProto

from recipe.rolloutpipe.filters import keep_if_metric_varies
from recipe.rolloutpipe.pipeline import PipelineInvariantError


def group(scores: list[float], acc: list[float]) -> DataProto:
    tokens = torch.zeros(len(scores), 4)
    tokens[:, -1] = torch.tensor(scores)  # verl puts the sequence score on the last response token
    return DataProto.from_dict(tensors={"token_level_scores": tokens}, non_tensors={"acc": np.array(acc)})


def test_a_group_without_variance_is_dropped_with_its_reason():
    assert keep_if_metric_varies(group([1, 0, 1, 1], [1, 1, 1, 1]), "reward") == (True, "")
    keep, reason = keep_if_metric_varies(group([1, 0, 1, 1], [1, 1, 1, 1]), "acc")
    assert not keep and reason == "all 4 values of acc are 1"
    assert keep_if_metric_varies(group([0, 0, 0, 0], [0, 1, 0, 0]), "reward") == (False, "all 4 values of reward are 0")


def test_an_unknown_metric_names_the_ones_there_are():
    with pytest.raises(PipelineInvariantError, match=r"metric='pass' is not among .*\['acc'\]: use reward"):
        keep_if_metric_varies(group([1, 0], [1, 0]), "pass")
