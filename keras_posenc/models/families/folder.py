"""A checkpoint folder as `save_pretrained` writes it: its config and tensors.

`read_folder(path)` returns the parsed `config.json` and a `{name: array}`
reader of `model.safetensors` (or the shards `model.safetensors.index.json`
names). The safetensors format is read directly (an 8-byte header length, a
JSON header of dtype, shape and byte offsets, then the raw little-endian
data), so bfloat16 tensors come back as `ml_dtypes.bfloat16` arrays (NumPy
alone has no such dtype) and no framework is needed to read a checkpoint.
"""

import json
import os
import struct

import ml_dtypes
import numpy as np

from keras_posenc import _checks

#: The safetensors dtypes a checkpoint's weights may have, as NumPy dtypes.
DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype("<f8"),
}
#: The single-file and the sharded checkpoint names.
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


def read_config(path):
    """The folder's `config.json` as a dict (`ValueError` naming what is missing)."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        _checks.fail("path", "a checkpoint folder (config.json, *.safetensors)", path)
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        _checks.fail(
            "path", "a folder with config.json (as save_pretrained writes it)", path
        )
    with open(config_path, encoding="utf-8") as file:
        return json.load(file)


def tensor_files(path):
    """`{tensor name: file}` of the folder's safetensors, headers read."""
    single, index = os.path.join(path, SINGLE), os.path.join(path, INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as file:
            weight_map = json.load(file).get("weight_map")
        if not isinstance(weight_map, dict):
            _checks.fail(INDEX, "a JSON object with a 'weight_map'", weight_map)
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
        if missing:
            _checks.fail(
                INDEX, f"shards that exist in {path}", missing, fix="Missing shards"
            )
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    if os.path.isfile(single):
        return {name: single for name in read_header(single)}
    _checks.fail(
        "path", f"a folder with {SINGLE} or {INDEX}", path, fix="No weights found"
    )


def read_header(file):
    """`{name: (dtype, shape, (begin, end))}` of one safetensors file."""
    with open(file, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return {
        name: (entry["dtype"], tuple(entry["shape"]), tuple(entry["data_offsets"]))
        for name, entry in header.items()
    }


class Tensors:
    """The tensors of a checkpoint folder, read when asked for, by name."""

    def __init__(self, path):
        self.files = tensor_files(path)
        self._headers = {}

    def names(self):
        return set(self.files)

    def entry(self, name):
        """`(dtype, shape, offsets, file)` of tensor `name`."""
        file = self.files[name]
        if file not in self._headers:
            self._headers[file] = read_header(file)
        header = self._headers[file]
        if name not in header:
            _checks.fail(name, f"a tensor of {os.path.basename(file)}", "absent")
        return (*header[name], file)

    def shape(self, name):
        return self.entry(name)[1]

    def read(self, name):
        """Tensor `name` as a NumPy array of its own dtype."""
        dtype, shape, (begin, end), file = self.entry(name)
        if dtype not in DTYPES:
            _checks.fail(
                name,
                f"a tensor of dtype among {sorted(DTYPES)}",
                dtype,
                fix="A quantized checkpoint cannot be imported as it is",
            )
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            handle.seek(8 + length + begin)
            data = handle.read(end - begin)
        return np.frombuffer(data, DTYPES[dtype]).reshape(shape)
