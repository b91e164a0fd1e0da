"""Shared fixtures: the server's addresses and what the generated repository holds.

The baton server under test is started by scripts/compat.sh, which passes
BATON_HTTP (host:port), BATON_GRPC (host:port) and BATON_EXPECTED (a JSON
file written by the compat_repo example: inputs and expected outputs).
"""

import json
import os

import numpy as np
import pytest


@pytest.fixture(scope="session")
def http_url():
    return os.environ["BATON_HTTP"]


@pytest.fixture(scope="session")
def grpc_url():
    return os.environ["BATON_GRPC"]


@pytest.fixture(scope="session")
def expected():
    with open(os.environ["BATON_EXPECTED"]) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def mlp(expected):
    m = expected["mlp"]
    batch, width, outputs = m["batch"], m["width"], m["outputs"]
    return {
        "model": m["model"],
        "input": np.array(m["input"], dtype=np.float32).reshape(batch, width),
        "expected": {v: np.array(out, dtype=np.float32).reshape(batch, outputs) for v, out in m["expected"].items()},
    }


def sample(datatype, batch=2, width=3):
    """Values of every datatype, with edge cases, shaped [batch, width]."""
    n = batch * width
    samples = {
        "BOOL": np.array([True, False, True] * n, dtype=np.bool_),
        "UINT8": np.array([0, 255, 7] * n, dtype=np.uint8),
        "UINT16": np.array([0, 65535, 7] * n, dtype=np.uint16),
        "UINT32": np.array([0, 2**32 - 1, 7] * n, dtype=np.uint32),
        "UINT64": np.array([0, 2**64 - 1, 7] * n, dtype=np.uint64),
        "INT8": np.array([-128, 127, -1] * n, dtype=np.int8),
        "INT16": np.array([-32768, 32767, -1] * n, dtype=np.int16),
        "INT32": np.array([-(2**31), 2**31 - 1, -1] * n, dtype=np.int32),
        "INT64": np.array([-(2**63), 2**63 - 1, -1] * n, dtype=np.int64),
        "FP16": np.array([1.0, -2.5, 65504.0] * n, dtype=np.float16),
        "FP32": np.array([1.5, -0.0, 3.4e38] * n, dtype=np.float32),
        "FP64": np.array([np.pi, -1e308, 5e-324] * n, dtype=np.float64),
        "BYTES": np.array([b"", b"hello", "gr\u00fc\u00dfe".encode()] * n, dtype=np.object_),
    }
    return samples[datatype][:n].reshape(batch, width)
