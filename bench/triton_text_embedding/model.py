"""Triton python-backend model for bench/text-embedding.sh, running the very
steps of the Python peer (bench/text_embedding_server.py: Python's
tokenizers, onnxruntime, numpy mean pooling and L2), each instance (stub
process) with its own tokenizer and onnxruntime session.

The config's parameter `step` says which steps this model runs:
  all       text (BYTES [n]) -> sentence_embedding (FP32 [n, 384])
  tokenize  text -> input_ids, attention_mask, token_type_ids (INT64 [n, s])
  graph     the three -> last_hidden_state (FP32 [n, s, 384]), onnxruntime
  pool      last_hidden_state, attention_mask -> sentence_embedding
The last three are the members of an ensemble, the layout a Triton user
would choose with the graph in Triton's onnxruntime backend.

Other parameters: `version_dir` (the sentence-transformers version
directory with model.onnx), `bench_dir` (where text_embedding_server.py
is), `intra_op_threads`, and `extra_sys_path` (appended to sys.path; where
`tokenizers` is when the Triton venv lacks it).
"""
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(name, array):
    return pb_utils.Tensor(name, np.ascontiguousarray(array))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        sys.path.insert(0, params["bench_dir"])
        if params.get("extra_sys_path"):
            sys.path.append(params["extra_sys_path"])
        import text_embedding_server as steps

        self.steps = steps
        self.step = params.get("step", "all")
        if self.step in ("all", "tokenize"):
            self.tokenizer = steps.load_tokenizer(params["version_dir"])
        if self.step in ("all", "graph"):
            self.session = steps.load_session(params["version_dir"], int(params.get("intra_op_threads", "1")))

    def run(self, request):
        get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()  # noqa: E731
        if self.step in ("all", "tokenize"):
            feeds = self.steps.tokenize(self.tokenizer, [t.decode("utf-8") for t in get("text").ravel()])
            if self.step == "tokenize":
                return [tensor(k, v) for k, v in feeds.items()]
        else:
            feeds = {k: get(k) for k in ("input_ids", "attention_mask", "token_type_ids") if self.step == "graph"}
        if self.step in ("all", "graph"):
            (hidden,) = self.session.run(["last_hidden_state"], feeds)
            if self.step == "graph":
                return [tensor("last_hidden_state", hidden)]
            mask = feeds["attention_mask"]
        else:
            hidden, mask = get("last_hidden_state"), get("attention_mask")
        return [tensor("sentence_embedding", self.steps.pool(hidden, mask).astype(np.float32))]

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=self.run(r)) for r in requests]
