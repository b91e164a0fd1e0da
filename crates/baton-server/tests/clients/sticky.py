"""Sends requests with sticky keys through NVIDIA's tritonclient, over HTTP
and gRPC, and prints what answered each as JSON for the Rust test that
started the server (crates/baton-server/tests/rollout.rs) to judge.

Usage: python sticky.py HTTP_ADDRESS GRPC_ADDRESS MODEL KEYS REPEATS

Prints one JSON object: for each way of sending the key ("http_header",
"http_parameter", "grpc_header", "grpc_parameter"), a map from key to the
list of [model_version, baton_role] of its answers.
"""

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def main():
    http_address, grpc_address, model, keys, repeats = sys.argv[1:6]
    keys = [f"user-{i}" for i in range(int(keys))]
    repeats = int(repeats)
    data = np.arange(8, dtype=np.float32).reshape(1, 8) / 8.0
    http = httpclient.InferenceServerClient(url=http_address)
    grpc = grpcclient.InferenceServerClient(url=grpc_address)

    def over_http(key, as_header):
        tensor = httpclient.InferInput("input", [1, 8], "FP32")
        tensor.set_data_from_numpy(data)
        if as_header:
            result = http.infer(model, [tensor], headers={"baton-sticky-key": key})
        else:
            result = http.infer(model, [tensor], parameters={"baton_sticky_key": key})
        response = result.get_response()
        return [response["model_version"], response.get("parameters", {}).get("baton_role")]

    def over_grpc(key, as_header):
        tensor = grpcclient.InferInput("input", [1, 8], "FP32")
        tensor.set_data_from_numpy(data)
        if as_header:
            result = grpc.infer(model, [tensor], headers={"baton-sticky-key": key})
        else:
            result = grpc.infer(model, [tensor], parameters={"baton_sticky_key": key})
        response = result.get_response()
        role = response.parameters["baton_role"].string_param if "baton_role" in response.parameters else None
        return [response.model_version, role]

    ways = {
        "http_header": lambda key: over_http(key, True),
        "http_parameter": lambda key: over_http(key, False),
        "grpc_header": lambda key: over_grpc(key, True),
        "grpc_parameter": lambda key: over_grpc(key, False),
    }
    seen = {name: {key: [send(key) for _ in range(repeats)] for key in keys} for name, send in ways.items()}
    http.close()
    grpc.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
