"""Named JSON records inside a `.tflite` file (the schema's `metadata` list).

A TFLite model carries named buffers beside its graph (the converter writes
`min_runtime_version` there); interpreters ignore names they do not know.
`convert_causal_lm` records a rolling cache's shape under `ROLLING` so the
host's generation and the device contract know that the step streams past
its cache length.
"""

import json

#: The metadata name of a streaming decode step's `{"sink_tokens": k,
#: "cache_window": W}`.
ROLLING = "keras_posenc.rolling_cache"


def add_metadata(model_bytes, name, record):
    """`model_bytes` with `record` (a JSON-able dict) stored under `name`.

    The model is unpacked and packed again with the schema's object API:
    the graph and every buffer are kept, the byte layout is not.
    """
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    buffer = schema.BufferT()
    buffer.data = list(json.dumps(record, sort_keys=True).encode())
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = name
    entry.buffer = len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or []) if m.name != name.encode()]
    model.metadata.append(entry)
    builder = flatbuffers.Builder(len(model_bytes) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def read_metadata(model_bytes, name):
    """The record stored under `name` in `model_bytes`, or None."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(bytes(model_bytes), 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name() == name.encode():
            data = model.Buffers(entry.Buffer()).DataAsNumpy()
            return json.loads(bytes(data).decode())
    return None
