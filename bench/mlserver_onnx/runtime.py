"""An ONNX inference runtime for MLServer (which ships none), for side-by-side
benchmarks with baton on the very same model.onnx files.

model-settings.json (written by bench/models.py):

    {"name": "mlp", "implementation": "runtime.OnnxModel",
     "parameters": {"uri": "/abs/path/to/1/model.onnx", "version": "1",
                    "extra": {"max_batch_size": 64, "intra_op_num_threads": 1}}}

load() opens the file with an onnxruntime InferenceSession (sequential
execution, `intra_op_num_threads` threads, 1 by default like baton's
sessions) and publishes the model's inputs and outputs as V2 metadata. It
runs on the event loop like MLServer's own runtimes; with the environment
variable BENCH_LOAD_IN_THREAD=1 the session is built in a worker thread.
predict() decodes every V2 input with MLServer's NumpyCodec, runs the
session, and encodes the requested outputs (all by default) with NumpyCodec,
answering with the model's name and version.

It also answers Triton's `GET /v2/models/{m}[/versions/{v}]/config` through
MLServer's custom-handler mechanism, which perf_analyzer needs; MLServer has
no such endpoint of its own. The handler answers for every model this
runtime has loaded in the process, whichever instance's route matched.

bench/run-mlserver.sh puts this directory and bench/ on PYTHONPATH.
"""

import asyncio
import os

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError, MLServerError
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse, MetadataTensor
from mlserver.utils import get_model_uri

from triton_config import onnx_signature, triton_config

# name -> (inputs, outputs, max_batch_size) of the models loaded in this process
_LOADED = {}


class ModelNotLoaded(MLServerError):
    def __init__(self, name):
        super().__init__(f"Model {name} is not loaded by the ONNX runtime", status_code=404)


class OnnxModel(MLModel):
    async def load(self) -> bool:
        path = await get_model_uri(self.settings, wellknown_filenames=["model.onnx"])
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        opts = ort.SessionOptions()
        threads = int(os.environ.get("BENCH_ORT_THREADS", extra.get("intra_op_num_threads", 1)))
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        def session():
            return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])

        if os.environ.get("BENCH_LOAD_IN_THREAD"):
            # Off the event loop, so the process keeps serving its other models.
            self._session = await asyncio.to_thread(session)
        else:
            # On the event loop, as MLServer's own runtimes (mlserver-sklearn,
            # mlserver-xgboost, ...) load their artefacts.
            self._session = session()
        inputs, outputs = onnx_signature(self._session)
        self._output_names = [o["name"] for o in outputs]
        self.inputs = [MetadataTensor(**t) for t in inputs]
        self.outputs = [MetadataTensor(**t) for t in outputs]
        _LOADED[self.name] = (inputs, outputs, int(extra.get("max_batch_size", 0)))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {inp.name: NumpyCodec.decode_input(inp) for inp in payload.inputs}
        wanted = [o.name for o in payload.outputs] if payload.outputs else self._output_names
        try:
            results = self._session.run(wanted, feeds)
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError) as e:
            raise InferenceError(str(e))
        outputs = [NumpyCodec.encode_output(name, np.asarray(r)) for name, r in zip(wanted, results)]
        for out in outputs:
            # NumpyCodec tags each output with parameters {"content_type": "np"};
            # Triton's HTTP client (perf_analyzer) then looks for
            # parameters.binary_data_size and fails. The tag only matters to
            # MLServer's own client-side decoding.
            out.parameters = None
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id, outputs=outputs)

    async def unload(self) -> bool:
        self._session = None
        return True

    @custom_handler(rest_path="/v2/models/{model_name}/config", rest_method="GET")
    async def triton_config(self, model_name: str) -> dict:
        return _config(model_name)

    @custom_handler(rest_path="/v2/models/{model_name}/versions/{model_version}/config", rest_method="GET")
    async def triton_config_version(self, model_name: str, model_version: str) -> dict:
        return _config(model_name)


def _config(model_name):
    if model_name not in _LOADED or os.environ.get("BENCH_NO_TRITON_CONFIG"):  # set it to see perf_analyzer without /config
        raise ModelNotLoaded(model_name)
    inputs, outputs, max_batch_size = _LOADED[model_name]
    return triton_config(model_name, inputs, outputs, max_batch_size)
