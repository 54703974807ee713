"""A rank's record is written whatever the script handed torch: numpy indices from a sampler
(Lightning Fabric's k-fold example: SubsetRandomSampler over numpy arrays) crashed every rank at its
end ("Object of type int64 is not JSON serializable")."""

import json

import numpy as np
import pytest

from rankwise.tools.watch.seen import _plain

pytestmark = pytest.mark.unit


def test_numpy_values_are_written_as_python_ones():
    record = {"first": [np.int64(3), np.int64(7)], "size": np.int32(40)}
    assert json.loads(json.dumps(record, default=_plain)) == {"first": [3, 7], "size": 40}
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        json.dumps({"x": object()}, default=_plain)
