"""NVIDIA's tritonclient (gRPC) against baton, unmodified."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import sample


@pytest.fixture(scope="module")
def client(grpc_url):
    return grpcclient.InferenceServerClient(url=grpc_url)


def inputs(array, datatype):
    inp = grpcclient.InferInput("input", list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return [inp]


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "baton"


def test_model_metadata_config_and_readiness(client, mlp):
    meta = client.get_model_metadata(mlp["model"], as_json=True)
    assert meta["name"] == mlp["model"]
    assert meta["inputs"][0]["name"] == "input"
    assert meta["inputs"][0]["datatype"] == "FP32"
    assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, 16]
    config = client.get_model_config(mlp["model"], as_json=True)["config"]
    assert int(config["max_batch_size"]) == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in config["input"][0]["dims"]] == [16]
    assert client.is_model_ready(mlp["model"])
    assert not client.is_model_ready("no_such_model")


def test_infer_matches_the_model(client, mlp):
    out = grpcclient.InferRequestedOutput("output")
    result = client.infer(mlp["model"], inputs(mlp["input"], "FP32"), outputs=[out], request_id="g-1")
    response = result.get_response(as_json=True)
    assert response["id"] == "g-1"
    np.testing.assert_allclose(result.as_numpy("output"), mlp["expected"][response["model_version"]], atol=1e-5)


@pytest.mark.parametrize(
    "datatype",
    ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"],
)
def test_every_datatype_round_trips(client, expected, datatype):
    array = sample(datatype)
    result = client.infer(expected["identity"][datatype], inputs(array, datatype))
    got = result.as_numpy("output")
    assert got.shape == array.shape
    if datatype == "BYTES":
        assert [bytes(x) for x in got.flatten()] == [bytes(x) for x in array.flatten()]
    else:
        np.testing.assert_array_equal(got, array)


def test_streaming_infer(client, mlp):
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(5):
            client.async_stream_infer(mlp["model"], inputs(mlp["input"], "FP32"), request_id=f"s-{i}")
        ids = []
        for _ in range(5):
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response(as_json=True)
            ids.append(response["id"])
            np.testing.assert_allclose(result.as_numpy("output"), mlp["expected"][response["model_version"]], atol=1e-5)
        assert sorted(ids) == [f"s-{i}" for i in range(5)]
    finally:
        client.stop_stream()


def test_repository_and_statistics(client, mlp):
    index = client.get_model_repository_index(as_json=True)["models"]
    states = {(m["name"], m.get("version", "")): m.get("state", "") for m in index}
    assert states[(mlp["model"], "2")] == "READY"
    client.unload_model(mlp["model"])
    assert not client.is_model_ready(mlp["model"])
    client.load_model(mlp["model"])
    assert client.is_model_ready(mlp["model"])
    client.infer(mlp["model"], inputs(mlp["input"], "FP32"))
    stats = client.get_inference_statistics(mlp["model"], as_json=True)
    assert stats["model_stats"][0]["name"] == mlp["model"]


def test_errors_carry_the_reason(client, mlp):
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("no_such_model", inputs(mlp["input"], "FP32"))
    with pytest.raises(InferenceServerException, match=r"input 'input'"):
        client.infer(mlp["model"], inputs(np.zeros((2, 5), dtype=np.float32), "FP32"))
