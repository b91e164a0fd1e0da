"""Triton python-backend model for bench/text-embedding.sh: texts in (BYTES
`text`, [n]), sentence embeddings out (FP32 `sentence_embedding`, [n, 384]),
by the very steps of the Python peer (bench/text_embedding_server.py's
Embedder: Python's tokenizers, onnxruntime, numpy mean pooling and L2),
each instance (stub process) with its own onnxruntime session.

The config's parameters: `version_dir` (the sentence-transformers version
directory with model.onnx), `bench_dir` (where text_embedding_server.py
is), `intra_op_threads`, and `extra_sys_path` (appended to sys.path; where
`tokenizers` is when the Triton venv lacks it).
"""
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        sys.path.insert(0, params["bench_dir"])
        if params.get("extra_sys_path"):
            sys.path.append(params["extra_sys_path"])
        from text_embedding_server import Embedder

        self.embedder = Embedder(params["version_dir"], int(params.get("intra_op_threads", "1")))

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = [t.decode("utf-8") for t in pb_utils.get_input_tensor_by_name(request, "text").as_numpy().ravel()]
            embeddings = self.embedder.embed(texts).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("sentence_embedding", np.ascontiguousarray(embeddings))]))
        return responses
