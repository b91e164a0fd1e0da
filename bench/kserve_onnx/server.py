#!/usr/bin/env python3
"""A KServe Python model server (kserve.ModelServer) running ONNX models with
onnxruntime, for side-by-side benchmarks with baton on the very same
model.onnx files. V2 protocol over REST (and gRPC with --grpc-port).

    python bench/kserve_onnx/server.py --repo .baton/bench/models/baton \
        [--models mlp,encoder] --http-port 8200 [--grpc-port 8201] [--host 127.0.0.1]

--repo is a baton repository (<name>/model.toml, <name>/<v>/model.onnx +
MANIFEST): each model serves its newest complete version (MANIFEST present),
as baton would at start.

Loopback only: kserve 0.21's RESTServer hard-codes host "0.0.0.0" in its
uvicorn.Config and its GRPCServer listens on "[::]:port", and neither
ModelServer nor its command line has a host option. So this server swaps in
a RESTServer subclass that rebinds its uvicorn config to --host, and, when
--grpc-port is given, a GRPCServer subclass whose start() listens on --host
(gRPC is off otherwise).

Reloading: kserve's `POST /v2/repository/models/{m}/load` calls
`ModelRepository.load(name)`, which is a no-op in the base class; serving
runtimes (kserve's sklearnserver, xgbserver, ...) subclass ModelRepository
and implement it. OnnxRepository.load does what they do: build a new model
object from the newest version on disk, load it, and put it in the registry
in place of the old one (`ModelRepository.update`). As in those servers the
load runs synchronously, on the event loop, so every request (to any model)
waits for it; --load-in-thread runs it in a worker thread instead.

Triton's `GET /v2/models/{m}[/versions/{v}]/config`, which perf_analyzer
needs and kserve does not serve, is added to kserve's FastAPI app.
"""

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import kserve
from kserve import InferOutput, InferRequest, InferResponse
from kserve import model_server as ks_model_server
from kserve.errors import InvalidInput, ModelNotFound
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.server import GRPCServer
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.rest.server import RESTServer
from kserve.utils.numpy_codec import from_np_dtype
from kserve.utils.utils import generate_uuid

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for triton_config
from triton_config import onnx_signature, triton_config  # noqa: E402

log = logging.getLogger("bench.kserve_onnx")
HOST = "127.0.0.1"  # set from --host in main()


def newest_version(model_dir: Path):
    """The newest version directory of a baton model that has its MANIFEST."""
    versions = sorted(
        (int(d.name), d) for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit() and (d / "MANIFEST").is_file()
    )
    if not versions:
        raise FileNotFoundError(f"{model_dir}: no complete version (a numbered directory with a MANIFEST)")
    return versions[-1]


def max_batch_size_of(model_dir: Path) -> int:
    toml = model_dir / "model.toml"
    if toml.is_file():
        for line in toml.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "max_batch_size":
                return int(value.split("#")[0].strip())
    return 0


class OnnxModel(kserve.Model):
    def __init__(self, name: str, path: Path, version: str, max_batch_size: int, threads: int):
        super().__init__(name)
        self.path, self.version, self.max_batch_size, self.threads = path, version, max_batch_size, threads
        self.session = None

    def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(self.path), sess_options=opts, providers=["CPUExecutionProvider"])
        self.inputs, self.outputs = onnx_signature(self.session)
        self.ready = True
        return self.ready

    def get_input_types(self):
        return self.inputs

    def get_output_types(self):
        return self.outputs

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        feeds = {inp.name: inp.as_numpy() for inp in payload.inputs}
        wanted = [o.name for o in payload.request_outputs] if payload.request_outputs else [o["name"] for o in self.outputs]
        try:
            results = self.session.run(wanted, feeds)
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError) as e:
            raise InvalidInput(str(e))
        outputs = []
        for name, result in zip(wanted, results):
            result = np.asarray(result)
            out = InferOutput(name=name, shape=list(result.shape), datatype=from_np_dtype(result.dtype))
            out.set_data_from_numpy(result, binary_data=payload.use_binary_outputs)
            outputs.append(out)
        return InferResponse(
            response_id=payload.id or generate_uuid(),
            model_name=self.name,
            model_version=self.version,
            infer_outputs=outputs,
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,
        )


class OnnxRepository(kserve.ModelRepository):
    """Models from a baton repository; `load(name)` (re)loads the newest version."""

    def __init__(self, models_dir: str, threads: int, load_in_thread: bool):
        super().__init__(models_dir)
        self.threads = threads
        self.load_in_thread = load_in_thread

    def build(self, name: str) -> OnnxModel:
        model_dir = Path(self.models_dir) / name
        if not model_dir.is_dir():
            raise ModelNotFound(name)
        version, vdir = newest_version(model_dir)
        model = OnnxModel(name, vdir / "model.onnx", str(version), max_batch_size_of(model_dir), self.threads)
        started = time.monotonic()
        model.load()
        log.info("loaded %s version %s in %.3f s", name, version, time.monotonic() - started)
        return model

    def load_model(self, name: str) -> bool:
        self.update(self.build(name))
        return True

    async def load(self, name: str) -> bool:  # POST /v2/repository/models/{name}/load
        if self.load_in_thread:
            model = await asyncio.to_thread(self.build, name)
        else:
            model = self.build(name)  # on the event loop, like kserve's own repositories
        self.update(model)
        return True


class LoopbackRESTServer(RESTServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.config.host = HOST  # kserve passes host="0.0.0.0" to uvicorn.Config


class LoopbackGRPCServer(GRPCServer):
    async def start(self, max_workers):
        from concurrent import futures

        from grpc import aio

        self._server = aio.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(self._data_plane, self._model_repository_extension), self._server
        )
        self._server.add_insecure_port(f"{HOST}:{self._port}")
        log.info("gRPC on %s:%d", HOST, self._port)
        await self._server.start()
        await self._server.wait_for_termination()


def add_config_routes(repo: OnnxRepository):
    async def config(model_name: str, model_version: str = None):
        model = repo.get_model(model_name)
        if not isinstance(model, OnnxModel) or not model.ready:
            raise ModelNotFound(model_name)
        return triton_config(model_name, model.inputs, model.outputs, model.max_batch_size)

    ks_model_server.app.add_api_route("/v2/models/{model_name}/config", config, methods=["GET"])
    ks_model_server.app.add_api_route("/v2/models/{model_name}/versions/{model_version}/config", config, methods=["GET"])


def main():
    global HOST
    ap = argparse.ArgumentParser(description="KServe ModelServer with onnxruntime models from a baton repository")
    ap.add_argument("--repo", required=True, help="baton repository: <name>/<version>/model.onnx + MANIFEST")
    ap.add_argument("--models", default="", help="comma-separated model names (default: every model in --repo)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--http-port", type=int, default=8080)
    ap.add_argument("--grpc-port", type=int, default=0, help="serve gRPC on this port too (default: off)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_ORT_THREADS", "1")),
                    help="onnxruntime intra-op threads per session (default 1, like baton)")
    ap.add_argument("--quiet", action="store_true",
                    help="no per-request logs (kserve logs every request twice by default: uvicorn.access and kserve.trace)")
    ap.add_argument("--load-in-thread", action="store_true",
                    help="run repository loads in a worker thread instead of on the event loop")
    args = ap.parse_args()
    HOST = args.host

    repo = OnnxRepository(args.repo, args.threads, args.load_in_thread)
    names = [n for n in args.models.split(",") if n] or sorted(
        d.name for d in Path(args.repo).iterdir() if d.is_dir() and (d / "model.toml").is_file()
    )
    models = [repo.build(n) for n in names]
    if not os.environ.get("BENCH_NO_TRITON_CONFIG"):  # set it to see perf_analyzer without /config
        add_config_routes(repo)
    ks_model_server.RESTServer = LoopbackRESTServer
    ks_model_server.GRPCServer = LoopbackGRPCServer
    server = kserve.ModelServer(
        http_port=args.http_port,
        grpc_port=args.grpc_port or 8081,
        enable_grpc=bool(args.grpc_port),
        workers=1,
        registered_models=repo,
        enable_latency_logging=False,
    )
    if args.quiet:
        for name in ("uvicorn.access", "kserve.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
    server.start(models)


if __name__ == "__main__":
    main()
