"""LiteRT-LM's calls, made through `ai_edge_litert`: an engine-protocol emulator.

`EngineEmulator` drives a `.litertlm` file's TFLite model exactly as the
engine does (`tflite_export.litert_lm`): caches zero-filled at the start and
carried between calls; the prompt but its last token split over the
`prefill_<N>` signatures (the longest while the rest fills it, then the
shortest that holds what is left, padded with token 0 at position 0); the
last prompt token through `decode`, then greedy decoding (the argmax of the
float logits) until a stop token or the context. Tests hold it to Keras'
`generate`, and the engine to it.
"""

import io
import pathlib
import re
import tempfile
import zlib

import numpy as np

from tflite_export.litert_lm import EXTRA, prefill_plan


def read_litert_lm(path):
    """What the `.litertlm` file `path` bundles, as the builder's reader dumps it.

    Returns:
        A dict: `"tflite"` (the model's bytes), `"tokenizer"` (the HF
        tokenizer's JSON text, or None) and `"metadata"` (the
        `LlmMetadata` proto).
    """
    try:
        from google.protobuf import text_format
        from litert_lm_builder import litertlm_peek
        from litert_lm_builder.runtime.proto import llm_metadata_pb2
    except ImportError as error:
        raise ImportError(
            f"reading a .litertlm needs litert-lm-builder: {EXTRA}"
        ) from error
    with tempfile.TemporaryDirectory() as folder:
        litertlm_peek.peek_litertlm_file(
            str(path), dump_files_dir=folder, output_stream=io.StringIO()
        )
        folder = pathlib.Path(folder)
        found = sorted(folder.glob("*.tflite"))
        if len(found) != 1:
            raise ValueError(
                f"`path` must bundle one TFLite model. Received: {len(found)} in {path}"
            )
        contents = {"tflite": found[0].read_bytes(), "tokenizer": None}
        for packed in folder.glob("*Tokenizer_Zlib*"):
            data = packed.read_bytes()
            contents["tokenizer"] = zlib.decompress(data[8:]).decode("utf-8")
        metadata = llm_metadata_pb2.LlmMetadata()
        for text in folder.glob("LlmMetadata*.pbtext"):
            text_format.Parse(text.read_text(), metadata)
        contents["metadata"] = metadata
        return contents


def tflite_from_litert_lm(path):
    """The bytes of the TFLite model bundled in the `.litertlm` file `path`."""
    return read_litert_lm(path)["tflite"]


class EngineEmulator:
    """The engine's signature calls on a bundled model, in Python.

    Args:
        model: the path of a `.litertlm` file, or the TFLite bytes of
            `tflite_export.litert_lm.engine_model`.
        num_threads: int, the interpreter's threads. Defaults to 1.
    """

    def __init__(self, model, num_threads=1):
        from ai_edge_litert.interpreter import Interpreter

        if not isinstance(model, (bytes, bytearray)):
            model = tflite_from_litert_lm(model)
        self.interpreter = Interpreter(
            model_content=bytes(model), num_threads=num_threads
        )
        signatures = self.interpreter.get_signature_list()
        self.prefill_lengths = sorted(
            int(m.group(1))
            for key in signatures
            if (m := re.fullmatch(r"prefill_(\d+)", key))
        )
        if "decode" not in signatures or not self.prefill_lengths:
            raise ValueError(
                "`model` must have `decode` and `prefill_<N>` signatures. "
                f"Received: {sorted(signatures)}"
            )
        self.runners = {
            key: self.interpreter.get_signature_runner(key) for key in signatures
        }
        inputs = self.runners["decode"].get_input_details()
        self.cache_names = [n for n in inputs if n.startswith("kv_cache_")]
        self.cache_length = int(inputs[self.cache_names[0]]["shape"][2])
        self.reset()

    def reset(self):
        """Zero caches, position 0 (a new session)."""
        details = self.runners["decode"].get_input_details()
        self.caches = {
            n: np.zeros(details[n]["shape"], details[n]["dtype"])
            for n in self.cache_names
        }
        self.position = 0

    def prefill(self, ids):
        """Runs `ids` through the prefill signatures as the engine splits them."""
        ids = np.asarray(ids, np.int32)
        start = 0
        for size, count in prefill_plan(self.prefill_lengths, len(ids)):
            tokens = np.zeros((1, size), np.int32)
            tokens[0, :count] = ids[start : start + count]
            where = np.zeros(size, np.int32)
            where[:count] = np.arange(self.position, self.position + count)
            out = self.runners[f"prefill_{size}"](
                tokens=tokens, input_pos=where, **self.caches
            )
            self.caches = {n: out[n] for n in self.cache_names}
            self.position += count
            start += count

    def decode(self, token):
        """Logits `(V,)` of `token` at the current position; the position moves on."""
        out = self.runners["decode"](
            tokens=np.array([[token]], np.int32),
            input_pos=np.array([self.position], np.int32),
            **self.caches,
        )
        self.caches = {n: out[n] for n in self.cache_names}
        self.position += 1
        return out["logits"][0, 0]

    def generate(self, prompt_ids, max_new_tokens, stop_tokens=()):
        """Greedy new token ids after `prompt_ids` (start token included), as a list."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("`prompt_ids` must hold at least one token. Received: []")
        self.reset()
        if len(prompt) > 1:
            self.prefill(prompt[:-1])
        token, new = prompt[-1], []
        while len(new) < max_new_tokens and self.position < self.cache_length:
            token = int(np.argmax(self.decode(token)))
            new.append(token)
            if token in stop_tokens:
                break
        return new
