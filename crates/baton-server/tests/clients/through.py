"""Keeps NVIDIA's tritonclient sending to one model, over HTTP keep-alive,
gRPC unary calls and one gRPC stream, until its standard input closes; the
Rust test that started the server (crates/baton-server/tests/upgrade.rs)
upgrades the server meanwhile and judges what this prints.

Usage: python through.py HTTP_ADDRESS GRPC_ADDRESS MODEL

Prints "sending" on a line of its own once every way has had an answer,
then, when its input closes, one JSON object: for each way ("http",
"grpc", "grpc_stream") the requests answered, the failures (as text) and
the versions that answered; for the stream also how many times the server
ended it and how many requests were sent again on a new stream.

A stream the server ends while draining ends with UNAVAILABLE after the
answer in progress; the server answers every request it read before
ending, so a request still unanswered when the stream ends was never read,
and is sent again on a new stream, as a client acting on that status does.
"""

import json
import queue
import sys
import threading

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

DATA = np.arange(8, dtype=np.float32).reshape(1, 8) / 8.0


def main():
    http_address, grpc_address, model = sys.argv[1:4]
    stop = threading.Event()
    seen = {}
    started = threading.Barrier(4)

    def way(name, send):
        record = {"answered": 0, "failed": [], "versions": []}
        seen[name] = record
        first = True
        while not stop.is_set():
            try:
                version = send()
                record["answered"] += 1
                if version not in record["versions"]:
                    record["versions"].append(version)
            except Exception as error:  # every failure is reported, none ends the loop
                record["failed"].append(f"{type(error).__name__}: {error}")
            if first:
                first = False
                started.wait()

    def unary(name, module, address, outputs_of, version_of):
        client = module.InferenceServerClient(url=address)
        tensor = module.InferInput("input", [1, 8], "FP32")
        tensor.set_data_from_numpy(DATA)

        def send():
            response = client.infer(model, [tensor]).get_response()
            assert outputs_of(response), response
            return version_of(response)

        way(name, send)
        client.close()

    def over_http():
        unary("http", httpclient, http_address, lambda r: r["outputs"], lambda r: r["model_version"])

    def over_grpc():
        unary("grpc", grpcclient, grpc_address, lambda r: r.outputs, lambda r: r.model_version)

    def over_stream():
        client = grpcclient.InferenceServerClient(url=grpc_address)
        tensor = grpcclient.InferInput("input", [1, 8], "FP32")
        tensor.set_data_from_numpy(DATA)
        answers = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        counts = {"stream_ends": 0, "resent": 0}

        def restart():
            counts["stream_ends"] += 1
            client.stop_stream()
            while not answers.empty():
                answers.get()
            client.start_stream(callback=lambda result, error: answers.put((result, error)))

        def send():
            while True:
                try:
                    client.async_stream_infer(model, [tensor])
                except InferenceServerException as error:
                    # The stream ended while no request was outstanding.
                    if "no longer in valid state" not in str(error):
                        raise
                    restart()
                    continue
                result, error = answers.get(timeout=60)
                if error is None:
                    response = result.get_response()
                    assert response.outputs, response
                    return response.model_version
                if "UNAVAILABLE" not in str(error.status()):
                    raise error
                # The server ended the stream before it read this request.
                counts["resent"] += 1
                restart()

        way("grpc_stream", send)
        client.stop_stream()
        client.close()
        seen["grpc_stream"].update(counts)

    threads = [threading.Thread(target=f) for f in (over_http, over_grpc, over_stream)]
    for thread in threads:
        thread.start()
    started.wait()
    print("sending", flush=True)
    sys.stdin.read()
    stop.set()
    for thread in threads:
        thread.join()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
