"""Reference sentence embeddings for baton's tests, computed the way
sentence-transformers computes them, without baton: Python's tokenizers
(cut to max_seq_length, a batch padded to its longest text), onnxruntime
on the graph, mean pooling with the attention mask and L2 normalization.

Usage: minilm_reference.py MODEL_DIR MODEL_ONNX TEXTS_JSON; prints the
embeddings as JSON.
"""
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from tokenizers import Tokenizer

model_dir, onnx_path, texts = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
max_length = json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
tokenizer.enable_truncation(max_length)
tokenizer.enable_padding()
encodings = tokenizer.encode_batch(texts)
feeds = {
    "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
    "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
    "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
}
session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
(hidden,) = session.run(["last_hidden_state"], feeds)
mask = feeds["attention_mask"][:, :, None].astype(np.float32)
pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
normalized = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
print(json.dumps(normalized.tolist()))
