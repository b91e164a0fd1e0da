"""Triton's model configuration (`GET /v2/models/{m}/config`) for a plain
ONNX model, so perf_analyzer accepts the Python peers (MLServer, KServe),
which do not publish one themselves. Shared by bench/mlserver_onnx and
bench/kserve_onnx; depends on nothing but the standard library.

What perf_analyzer reads from it: `max_batch_size` (0 = no batching; > 0 and
it drops the first metadata dimension and prepends `-b`), input and output
names, `is_shape_tensor`, `optional`, `model_transaction_policy.decoupled`,
`response_cache.enable`, and the presence of `sequence_batching` /
`dynamic_batching` / an ensemble.
"""

ONNX_TO_V2 = {
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(float16)": "FP16",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def onnx_signature(session):
    """[{name, datatype, shape}] for an onnxruntime InferenceSession's inputs and outputs;
    symbolic or unknown dimensions become -1."""

    def tensors(args):
        return [
            {
                "name": a.name,
                "datatype": ONNX_TO_V2.get(a.type, "BYTES"),
                "shape": [d if isinstance(d, int) and d >= 0 else -1 for d in a.shape],
            }
            for a in args
        ]

    return tensors(session.get_inputs()), tensors(session.get_outputs())


def batched(inputs, outputs):
    return all(t["shape"] and t["shape"][0] == -1 for t in inputs + outputs)


def triton_config(name, inputs, outputs, max_batch_size, platform="onnxruntime_onnx"):
    """inputs/outputs: [{name, datatype, shape}] as in V2 metadata (shape with the batch dim)."""
    use_batch = max_batch_size > 0 and batched(inputs, outputs)

    def dims(t):
        return list(t["shape"][1:] if use_batch else t["shape"])

    def dtype(t):
        return "TYPE_STRING" if t["datatype"] == "BYTES" else "TYPE_" + t["datatype"]

    return {
        "name": name,
        "platform": platform,
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size if use_batch else 0,
        "input": [
            {"name": t["name"], "data_type": dtype(t), "format": "FORMAT_NONE", "dims": dims(t),
             "is_shape_tensor": False, "optional": False}
            for t in inputs
        ],
        "output": [
            {"name": t["name"], "data_type": dtype(t), "dims": dims(t), "is_shape_tensor": False}
            for t in outputs
        ],
        "instance_group": [{"name": name, "kind": "KIND_CPU", "count": 1}],
        "model_transaction_policy": {"decoupled": False},
        "response_cache": {"enable": False},
    }
