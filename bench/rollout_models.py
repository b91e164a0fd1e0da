#!/usr/bin/env python3
"""Candidates for bench/rollout-drill.sh, made from version 1 of the
benchmark MLP (bench/models.py), each sealed with `baton package`:

    .baton/bench-venv-tools/bin/python bench/rollout_models.py V1_DIR OUT_DIR BATON

  OUT_DIR/identical  the same graph and weights as version 1;
  OUT_DIR/nan        version 1's output plus 0 * sqrt(input[:, 0] + 0.8):
                     the same answer where the first input is at least -0.8,
                     NaN below it (one request in ten, for uniform inputs);
  OUT_DIR/late       version 1's output plus 1000 * relu(input[:, 0] - 0.9):
                     the same answer where the first input is at most 0.9,
                     far off above it.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper


def with_tail(model, name, scale, offset, op):
    """Renames the output `output` to `base`, and adds `output` = base +
    scale * op(input[:, 0:1] + offset)."""
    g = model.graph
    for node in g.node:
        node.output[:] = ["base" if o == "output" else o for o in node.output]
    consts = {
        f"{name}.starts": np.array([0], np.int64),
        f"{name}.ends": np.array([1], np.int64),
        f"{name}.axes": np.array([1], np.int64),
        f"{name}.offset": np.array([offset], np.float32),
        f"{name}.scale": np.array([scale], np.float32),
    }
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    g.node.extend([
        helper.make_node("Slice", ["input", f"{name}.starts", f"{name}.ends", f"{name}.axes"], [f"{name}.first"]),
        helper.make_node("Add", [f"{name}.first", f"{name}.offset"], [f"{name}.shifted"]),
        helper.make_node(op, [f"{name}.shifted"], [f"{name}.op"]),
        helper.make_node("Mul", [f"{name}.op", f"{name}.scale"], [f"{name}.scaled"]),
        helper.make_node("Add", ["base", f"{name}.scaled"], ["output"]),
    ])
    onnx.checker.check_model(model)
    return model


def main():
    v1, out, baton = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    variants = {
        "identical": None,
        "nan": ("nan", 0.0, 0.8, "Sqrt"),
        "late": ("late", 1000.0, -0.9, "Relu"),
    }
    for variant, tail in variants.items():
        d = out / variant
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        model = onnx.load(str(v1 / "model.onnx"))
        if tail:
            model = with_tail(model, *tail)
        onnx.save(model, str(d / "model.onnx"))
        subprocess.run([baton, "package", str(d)], check=True, stdout=subprocess.DEVNULL)
        print(f"{variant}: {d}")


if __name__ == "__main__":
    main()
