"""Names and order for people: an export's signature tensors, edited in place.

The converter names a signature's outputs `PartitionedCall:N` and orders
inputs and outputs as it likes; `name_tensors` gives the decode and prefill
steps the layout `tflite_export.contract` documents (`token, index, cache_0
..` in, `logits, cache_0 ..` out), without moving a byte of the model's
buffers.
"""

import re
import struct

import numpy as np

from tflite_export.contract import _signatures
from tflite_export.firmware import read_model


def name_tensors(model_bytes):
    """The export with every signature's tensors named and ordered for people.

    The converter names a signature's outputs `PartitionedCall:N` and orders
    inputs and outputs as it likes. This lays each signature's subgraph out
    as `token, index, cache_0 ..` (or `tokens`) in and `logits, cache_0 ..`
    out, each tensor named as its signature key. The edit is in place: the
    subgraph's input and output lists are permuted (signatures point at
    tensors, not positions) and each name is written over the old one (never
    longer), so no buffer moves and the model runs exactly as before.
    """
    data = bytearray(model_bytes)
    model = read_model(data)  # a view of `data`: the edits below change it
    for number, inputs, outputs in _signatures(model).values():
        subgraph = model.Subgraphs(number)
        for names, listed in (
            (inputs, subgraph.InputsAsNumpy()),
            (outputs, subgraph.OutputsAsNumpy()),
        ):
            tensors = {tensor: name for name, tensor in names.items()}
            if sorted(int(t) for t in listed) != sorted(tensors):
                raise ValueError(
                    "A signature does not list its subgraph's inputs and outputs"
                )
            ordered = sorted(tensors, key=lambda t: _order(tensors[t]))
            listed[:] = np.asarray(ordered, listed.dtype)  # a view into `data`
            for tensor, name in tensors.items():
                _rename(data, subgraph.Tensors(tensor), name)
    return bytes(data)


def _order(name):
    """Sort key: token/tokens, index, logits first, then caches by number,
    then `convert`'s `output_0, output_1 ..` (a Keras model's outputs, in its
    order) by number."""
    first = {"token": 0, "tokens": 0, "index": 1, "logits": 0}
    if name in first:
        return (first[name], 0, name)
    for rank, pattern in ((2, r"cache_(\d+)"), (3, r"output_(\d+)")):
        match = re.fullmatch(pattern, name)
        if match:
            return (rank, int(match.group(1)), name)
    return (4, 0, name)


def _rename(data, tensor, name):
    """Writes `name` over `tensor`'s name string (same place, never longer)."""
    slot = tensor._tab.Offset(10)  # Tensor.name in the TFLite schema
    if slot == 0:
        raise ValueError("A signature tensor has no name to replace")
    position = tensor._tab.Pos + slot
    start = position + struct.unpack_from("<I", data, position)[0]
    length = struct.unpack_from("<I", data, start)[0]
    if bytes(data[start + 4 : start + 4 + length]) != tensor.Name():
        raise ValueError("The tensor's name is not where the schema puts it")
    new = name.encode()
    if len(new) > length:
        return  # keep a short name the signature already explains
    data[start + 4 : start + 5 + length] = new + bytes(length + 1 - len(new))
    struct.pack_into("<I", data, start, len(new))
