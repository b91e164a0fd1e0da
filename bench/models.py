#!/usr/bin/env python3
"""Generates the benchmark models as ONNX files, deterministically (seeded).

Run with the tools venv made by bench/setup-peers.sh (onnx + numpy):

    .baton/bench-venv-tools/bin/python bench/models.py [--out DIR] [--only mlp,encoder,big]

Models (every one: FP32, dynamic batch dimension, input "input", output "output"):

  mlp      MLP 256-1024-512-1 (MatMul+Add+Relu), 0.8 M parameters, 3.0 MiB.
           input [-1, 256], output [-1, 1].
  encoder  a real transformer encoder, "transformer-sized": 8 pre-LayerNorm
           blocks, d_model 512, 8 heads, FFN 2048 (GELU), sequence length 32,
           mean-pooled into a linear head. 25.2 M parameters, 96 MiB.
           input [-1, 32, 512] (already-embedded tokens), output [-1, 1].
  big      MLP 1024-8192-8192-6144-1, 125.8 M parameters, 480 MiB (503 MB):
           the model whose load must not slow serving of the others.
           input [-1, 1024], output [-1, 1].

Each model gets versions 1..N (different weights) under OUT/baton/<name>/,
sealed with `baton package` (MANIFEST written last), plus S more versions,
N+1..N+S, staged unsealed under OUT/next/<name>/ for swap drills (copy one
into the repository, then run `baton package` on it). N and S: mlp 3 and 3,
encoder 3 and 1, big 2 and 1 (--versions, --staged override them).

Layout written (OUT defaults to .baton/bench/models):

  OUT/baton/<name>/model.toml, OUT/baton/<name>/<v>/{model.onnx,MANIFEST}
  OUT/next/<name>/<N+k>/model.onnx
  OUT/mlserver/<name>/<v>/model-settings.json   uri -> ../../../baton/<name>/<v>/model.onnx
  OUT/mlserver-next/<name>/<N+k>/model-settings.json

The same file is thus served by baton, MLServer (bench/mlserver_onnx) and
KServe (bench/kserve_onnx/server.py --repo OUT/baton). A model whose files
already exist with the same generator parameters is not rebuilt (a stamp
file records them), so re-running is cheap.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
GENERATOR_VERSION = 1  # bump when the graphs or the initialisation change
SEED = 20240611
OPSET = 17  # LayerNormalization needs 17
IR_VERSION = 8  # read by every ONNX Runtime >= 1.13


# ---------------------------------------------------------------- graphs ---


def _rng(name, version):
    digest = hashlib.sha256(f"{SEED}/{name}/{version}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _normal(rng, shape, std):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def _model(graph, producer="baton-bench"):
    model = helper.make_model(
        graph,
        producer_name=producer,
        producer_version=str(GENERATOR_VERSION),
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    model.ir_version = IR_VERSION
    return model


def mlp_model(sizes, rng, graph_name):
    """MatMul -> Add -> Relu per hidden layer, MatMul -> Add for the last;
    weights "fc{i}.weight" [in, out] (He-initialised) and "fc{i}.bias" [out]."""
    nodes, inits = [], []
    x = "input"
    last = len(sizes) - 2
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w, b = f"fc{i}.weight", f"fc{i}.bias"
        inits.append(numpy_helper.from_array(_normal(rng, (fan_in, fan_out), np.sqrt(2.0 / fan_in)), w))
        inits.append(numpy_helper.from_array(_normal(rng, (fan_out,), 0.01), b))
        mm = f"fc{i}.matmul"
        y = "output" if i == last else f"fc{i}.add"
        nodes.append(helper.make_node("MatMul", [x, w], [mm], name=f"fc{i}/MatMul"))
        nodes.append(helper.make_node("Add", [mm, b], [y], name=f"fc{i}/Add"))
        x = y
        if i != last:
            nodes.append(helper.make_node("Relu", [x], [f"relu{i}"], name=f"relu{i}/Relu"))
            x = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        graph_name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=inits,
    )
    return _model(graph)


def encoder_model(rng, layers=8, d=512, heads=8, ffn=2048, seq=32):
    """Pre-LN transformer encoder: per block
    x += Wo·Attention(LN(x)), x += W2·GELU(W1·LN(x)); then LN, mean over the
    sequence, and a linear head to one score."""
    dh = d // heads
    nodes, inits = [], []

    def init(name, array):
        inits.append(numpy_helper.from_array(array, name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x, prefix, fan_in, fan_out):
        w = init(f"{prefix}.weight", _normal(rng, (fan_in, fan_out), np.sqrt(1.0 / fan_in)))
        b = init(f"{prefix}.bias", _normal(rng, (fan_out,), 0.01))
        return node("Add", [node("MatMul", [x, w], f"{prefix}/MatMul"), b], f"{prefix}/Add")

    def layer_norm(x, prefix):
        g = init(f"{prefix}.weight", np.ones(d, np.float32) + _normal(rng, (d,), 0.01))
        b = init(f"{prefix}.bias", _normal(rng, (d,), 0.01))
        return node("LayerNormalization", [x, g, b], f"{prefix}/LayerNorm", axis=-1, epsilon=1e-5)

    split_shape = init("shape.split_heads", np.array([0, 0, heads, dh], np.int64))
    merge_shape = init("shape.merge_heads", np.array([0, 0, d], np.int64))
    scale = init("const.attn_scale", np.array(1.0 / np.sqrt(dh), np.float32))
    half = init("const.half", np.array(0.5, np.float32))
    one = init("const.one", np.array(1.0, np.float32))
    inv_sqrt2 = init("const.inv_sqrt2", np.array(1.0 / np.sqrt(2.0), np.float32))

    x = "input"
    for l in range(layers):
        p = f"layer{l}"
        h = layer_norm(x, f"{p}.ln1")
        q = node("Reshape", [linear(h, f"{p}.attn.q", d, d), split_shape], f"{p}.attn.q/Reshape")
        k = node("Reshape", [linear(h, f"{p}.attn.k", d, d), split_shape], f"{p}.attn.k/Reshape")
        v = node("Reshape", [linear(h, f"{p}.attn.v", d, d), split_shape], f"{p}.attn.v/Reshape")
        q = node("Transpose", [q], f"{p}.attn.q/Transpose", perm=[0, 2, 1, 3])  # [B,h,S,dh]
        k = node("Transpose", [k], f"{p}.attn.k/Transpose", perm=[0, 2, 3, 1])  # [B,h,dh,S]
        v = node("Transpose", [v], f"{p}.attn.v/Transpose", perm=[0, 2, 1, 3])  # [B,h,S,dh]
        scores = node("Mul", [node("MatMul", [q, k], f"{p}.attn/QK"), scale], f"{p}.attn/Scale")
        probs = node("Softmax", [scores], f"{p}.attn/Softmax", axis=-1)
        ctx = node("MatMul", [probs, v], f"{p}.attn/PV")
        ctx = node("Transpose", [ctx], f"{p}.attn/Transpose", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge_shape], f"{p}.attn/Merge")
        x = node("Add", [x, linear(ctx, f"{p}.attn.out", d, d)], f"{p}/Residual1")
        h = layer_norm(x, f"{p}.ln2")
        f = linear(h, f"{p}.ffn.fc1", d, ffn)
        erf = node("Erf", [node("Mul", [f, inv_sqrt2], f"{p}.ffn/Scale")], f"{p}.ffn/Erf")
        gelu = node("Mul", [node("Mul", [f, half], f"{p}.ffn/Half"), node("Add", [erf, one], f"{p}.ffn/One")], f"{p}.ffn/Gelu")
        x = node("Add", [x, linear(gelu, f"{p}.ffn.fc2", ffn, d)], f"{p}/Residual2")
    x = layer_norm(x, "final.ln")
    pooled = node("ReduceMean", [x], "pool/ReduceMean", axes=[1], keepdims=0)  # [B, d]
    w = init("head.weight", _normal(rng, (d, 1), np.sqrt(1.0 / d)))
    b = init("head.bias", _normal(rng, (1,), 0.01))
    nodes.append(helper.make_node("MatMul", [pooled, w], ["head/MatMul"], name="head/MatMul"))
    nodes.append(helper.make_node("Add", ["head/MatMul", b], ["output"], name="head/Add"))
    graph = helper.make_graph(
        nodes,
        "bench_encoder",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", seq, d])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1])],
        initializer=inits,
    )
    return _model(graph)


# ---------------------------------------------------------------- models ---

MODELS = {
    "mlp": {
        "build": lambda rng: mlp_model([256, 1024, 512, 1], rng, "bench_mlp"),
        "input_shape": [-1, 256],
        "max_batch_size": 64,
        "warmup": None,  # baton's defaults: batches 1, 8, 32, 64
        "versions": 3,
        "staged": 3,  # one per round of a swap drill
    },
    "encoder": {
        "build": lambda rng: encoder_model(rng),
        "input_shape": [-1, 32, 512],
        "max_batch_size": 16,
        "warmup": {"batch_sizes": [1, 8], "max_latency_ms": 10000},
        "versions": 3,
        "staged": 1,
    },
    "big": {
        "build": lambda rng: mlp_model([1024, 8192, 8192, 6144, 1], rng, "bench_big"),
        "input_shape": [-1, 1024],
        "max_batch_size": 16,
        "warmup": {"batch_sizes": [1, 8], "max_latency_ms": 10000},
        "versions": 2,
        "staged": 1,
    },
}


def model_toml(spec):
    shape = ", ".join(str(s) for s in spec["input_shape"])
    lines = [
        "# Generated by bench/models.py.",
        'backend = "onnx"',
        f"max_batch_size = {spec['max_batch_size']}",
        f'inputs = [{{ name = "input", datatype = "FP32", shape = [{shape}] }}]',
        'outputs = [{ name = "output", datatype = "FP32", shape = [-1, 1] }]',
    ]
    if spec["warmup"]:
        w = spec["warmup"]
        lines += ["", "[warmup]", f"batch_sizes = {w['batch_sizes']}", f"max_latency_ms = {w['max_latency_ms']}"]
    return "\n".join(lines) + "\n"


def mlserver_settings(name, version, onnx_path, max_batch_size):
    # "max_batch_size" is kept under parameters.extra: at the top level it
    # would switch on MLServer's adaptive batching. It feeds /config only.
    return {
        "name": name,
        "implementation": "runtime.OnnxModel",
        "parameters": {
            "uri": onnx_path,
            "version": str(version),
            "extra": {"max_batch_size": max_batch_size, "intra_op_num_threads": 1},
        },
    }


def find_baton(explicit):
    candidates = [explicit] if explicit else [ROOT / "target/release/baton", ROOT / "target/debug/baton"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    sys.exit(
        "models.py: no baton binary (looked at target/release/baton, target/debug/baton); "
        "build it with `cargo build --release -p baton-server` or pass --baton PATH"
    )


def write_atomic(path, data):
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def build(name, spec, out, baton, versions, staged, force):
    repo = out / "baton" / name
    stamp_key = json.dumps({"gen": GENERATOR_VERSION, "seed": SEED, "versions": versions, "staged": staged, "toml": model_toml(spec)})
    stamp = out / f".stamp-{name}"
    if not force and stamp.is_file() and stamp.read_text() == stamp_key:
        print(f"{name}: up to date ({versions} versions + {staged} staged)")
        return
    for d in (repo, out / "next" / name, out / "mlserver" / name, out / "mlserver-next" / name):
        shutil.rmtree(d, ignore_errors=True)
    repo.mkdir(parents=True)
    write_atomic(repo / "model.toml", model_toml(spec))
    for v in range(1, versions + staged + 1):
        is_staged = v > versions
        vdir = (out / "next" / name / str(v)) if is_staged else (repo / str(v))
        vdir.mkdir(parents=True)
        model = spec["build"](_rng(name, v))
        onnx.checker.check_model(model)
        data = model.SerializeToString()
        write_atomic(vdir / "model.onnx", data)
        # MLServer reads the file where baton serves it (for a staged version,
        # once it is copied into the repository), by a path relative to
        # model-settings.json, so OUT can be copied or moved as a whole.
        served = f"../../../baton/{name}/{v}/model.onnx"
        mdir = out / ("mlserver-next" if is_staged else "mlserver") / name / str(v)
        mdir.mkdir(parents=True)
        write_atomic(mdir / "model-settings.json", json.dumps(mlserver_settings(name, v, served, spec["max_batch_size"]), indent=2) + "\n")
        if not is_staged:
            subprocess.run([str(baton), "package", str(vdir)], check=True, stdout=subprocess.DEVNULL)
        params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        print(f"{name} v{v}{' (staged)' if is_staged else ''}: {params / 1e6:.1f} M parameters, {len(data) / 2**20:.1f} MiB -> {vdir}")
    write_atomic(stamp, stamp_key)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".baton/bench/models")
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--versions", type=int, default=None, help="versions per model (default per model)")
    ap.add_argument("--staged", type=int, default=None, help="unsealed versions staged under OUT/next per model (default per model)")
    ap.add_argument("--baton", type=Path, default=None, help="baton binary for `baton package`")
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = ap.parse_args()
    baton = find_baton(args.baton)
    out = args.out.resolve()
    for name in args.only.split(","):
        if name not in MODELS:
            sys.exit(f"models.py: unknown model {name!r}; known: {', '.join(MODELS)}")
        spec = MODELS[name]
        build(name, spec, out, baton, args.versions or spec["versions"],
              spec["staged"] if args.staged is None else args.staged, args.force)
    print(f"repository: {out / 'baton'}  (MLServer: {out / 'mlserver'}, staged: {out / 'next'})")


if __name__ == "__main__":
    main()
