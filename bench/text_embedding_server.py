"""A minimal Python text-embedding service speaking KServe V2 JSON over
HTTP/1.1, the peer bench/text-embedding.sh measures baton against: what a
user runs when the tokenizer and pooling live beside the model in Python.

Per request: Python's `tokenizers` (the version's tokenizer.json, cut to
sentence_bert_config.json's max_seq_length, the request's texts padded to
the longest), onnxruntime on model.onnx (one session shared by every
thread; intra_op_num_threads as baton's sessions have it, 1 by default),
mean pooling with the attention mask and L2 normalization in numpy.
http.server's ThreadingHTTPServer: a thread per connection, keep-alive.
The tokenizer's own thread pool is off (TOKENIZERS_PARALLELISM=false), as
baton tokenizes on the thread that runs the request.

Usage: text_embedding_server.py VERSION_DIR PORT [--model NAME] [--threads N]

Routes: GET /v2/health/ready, GET /v2/models/NAME/ready, POST
/v2/models/NAME/infer with one BYTES input (a text a row, as JSON strings);
answers sentence_embedding FP32 [n, 384]. Binds 127.0.0.1 only.
"""
import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def load_tokenizer(version_dir):
    """The version's tokenizer, cut to max_seq_length, padding to the longest."""
    version_dir = Path(version_dir)
    max_length = json.loads((version_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = Tokenizer.from_file(str(version_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()
    return tokenizer


def load_session(version_dir, threads):
    """An onnxruntime session of the version's model.onnx."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        str(Path(version_dir) / "model.onnx"), options, providers=["CPUExecutionProvider"])


def tokenize(tokenizer, texts):
    """The graph's three INT64 [batch, sequence] inputs for texts."""
    encodings = tokenizer.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def pool(hidden, attention_mask):
    """Mean over the tokens the mask keeps, then each row over its L2 norm."""
    mask = attention_mask[:, :, None].astype(np.float32)
    pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
    return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


class Embedder:
    """The sentence-transformers steps around one shared onnxruntime session."""

    def __init__(self, version_dir, threads):
        self.tokenizer = load_tokenizer(version_dir)
        self.session = load_session(version_dir, threads)

    def embed(self, texts):
        feeds = tokenize(self.tokenizer, texts)
        (hidden,) = self.session.run(["last_hidden_state"], feeds)
        return pool(hidden, feeds["attention_mask"])


def handler(model, embedder):
    infer_path = f"/v2/models/{model}/infer"
    ready_paths = {"/v2/health/ready", "/v2/health/live", f"/v2/models/{model}/ready"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The head and the body go out in two writes: with Nagle's algorithm
        # the body waits for the client's delayed ACK (40 ms a request).
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ready_paths:
                self.answer(200, {})
            else:
                self.answer(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != infer_path:
                self.answer(404, {"error": f"no route {self.path}"})
                return
            try:
                request = json.loads(body)
                (tensor,) = request["inputs"]
                if tensor["datatype"] != "BYTES":
                    raise ValueError("the input is BYTES, one text a row")
                texts = [str(t) for t in tensor["data"]]
            except (ValueError, KeyError, TypeError) as e:
                self.answer(400, {"error": f"bad request: {e}"})
                return
            embeddings = embedder.embed(texts)
            self.answer(200, {"model_name": model, "outputs": [{
                "name": "sentence_embedding", "datatype": "FP32", "shape": list(embeddings.shape),
                "data": embeddings.ravel().tolist()}]})

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version_dir")
    parser.add_argument("port", type=int)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    args = parser.parse_args()
    embedder = Embedder(args.version_dir, args.threads)
    embedder.embed(["warmup"])
    # socketserver's listen backlog is 5: 16 clients connecting at once
    # would see resets.
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.model, embedder))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
