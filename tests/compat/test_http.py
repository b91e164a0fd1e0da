"""NVIDIA's tritonclient (HTTP) against baton, unmodified."""

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import sample


@pytest.fixture(scope="module")
def client(http_url):
    return httpclient.InferenceServerClient(url=http_url)


def infer(client, model, array, datatype, binary, version=""):
    inp = httpclient.InferInput("input", list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    out = httpclient.InferRequestedOutput("output", binary_data=binary)
    return client.infer(model, [inp], outputs=[out], model_version=version, request_id="req-7")


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "baton"
    assert "binary_tensor_data" in meta["extensions"]
    assert "model_repository" in meta["extensions"]


def test_model_metadata_config_and_readiness(client, mlp):
    meta = client.get_model_metadata(mlp["model"])
    assert meta["name"] == mlp["model"]
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 16]}
    assert meta["outputs"][0]["name"] == "output"
    config = client.get_model_config(mlp["model"])
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [16]
    assert client.is_model_ready(mlp["model"])
    assert not client.is_model_ready("no_such_model")


@pytest.mark.parametrize("binary", [False, True])
def test_infer_matches_the_model(client, mlp, binary):
    result = infer(client, mlp["model"], mlp["input"], "FP32", binary)
    response = result.get_response()
    assert response["id"] == "req-7"
    version = response["model_version"]
    np.testing.assert_allclose(result.as_numpy("output"), mlp["expected"][version], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "datatype",
    ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"],
)
@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips(client, expected, datatype, binary):
    array = sample(datatype)
    result = infer(client, expected["identity"][datatype], array, datatype, binary)
    got = result.as_numpy("output")
    assert got.shape == array.shape
    if datatype == "BYTES":
        as_bytes = lambda x: x.encode() if isinstance(x, str) else bytes(x)  # JSON gives str, binary bytes
        assert [as_bytes(x) for x in got.flatten()] == [as_bytes(x) for x in array.flatten()]
    else:
        np.testing.assert_array_equal(got, array)


def test_named_version_and_repository(client, mlp):
    index = client.get_model_repository_index()
    rows = {(r["name"], r["version"]): r["state"] for r in index}
    assert rows[(mlp["model"], "1")] == "UNAVAILABLE"
    assert rows[(mlp["model"], "2")] == "READY"

    client.unload_model(mlp["model"])
    assert not client.is_model_ready(mlp["model"])
    with pytest.raises(InferenceServerException):
        infer(client, mlp["model"], mlp["input"], "FP32", True)
    client.load_model(mlp["model"])
    assert client.is_model_ready(mlp["model"])
    result = infer(client, mlp["model"], mlp["input"], "FP32", True, version="2")
    assert result.get_response()["model_version"] == "2"
    np.testing.assert_allclose(result.as_numpy("output"), mlp["expected"]["2"], atol=1e-5)


def test_errors_are_exceptions_with_the_reason(client, mlp):
    with pytest.raises(InferenceServerException, match="unknown model"):
        infer(client, "no_such_model", mlp["input"], "FP32", True)
    wrong = np.zeros((2, 5), dtype=np.float32)
    with pytest.raises(InferenceServerException, match=r"input 'input': expected shape \[-1, 16\], got \[2, 5\]"):
        infer(client, mlp["model"], wrong, "FP32", True)
