"""Sends texts as BYTES with NVIDIA's tritonclient, over HTTP and gRPC, to a
model whose version tokenizes them; prints one JSON object: for each way
("http", "grpc") the embeddings answered, and the error a text that is not
UTF-8 got. Run by crates/baton-server/tests/processing.rs.

Usage: python texts.py HTTP_ADDRESS GRPC_ADDRESS MODEL TEXTS_JSON
"""

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

http_address, grpc_address, model, texts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
result = {}
for way, client_module, client in [
    ("http", httpclient, httpclient.InferenceServerClient(http_address)),
    ("grpc", grpcclient, grpcclient.InferenceServerClient(grpc_address)),
]:
    def infer(values):
        data = np.array(values, dtype=np.object_)
        tensor = client_module.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        return client.infer(model, [tensor])

    answer = infer([t.encode() for t in texts])
    embeddings = answer.as_numpy("embedding")
    try:
        infer([b"not \xff utf-8"])
        refused = None
    except InferenceServerException as e:
        refused = {"status": str(e.status()), "message": e.message()}
    result[way] = {"embeddings": embeddings.tolist(), "refused": refused}
print(json.dumps(result))
