"""The fully connected kernels of a TFLite model, read from its flatbuffer."""

import numpy as np


def fully_connected_kernels(model_bytes):
    """`[(kernel tensor, its bytes, bias tensor, bias bytes, input scale)]`."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    found = []
    for graph in model.subgraphs:
        for op in graph.operators:
            if (
                flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
                != "FULLY_CONNECTED"
            ):
                continue
            kernel = graph.tensors[op.inputs[1]]
            bias = graph.tensors[op.inputs[2]] if op.inputs[2] >= 0 else None
            found.append(
                (
                    kernel,
                    np.asarray(model.buffers[kernel.buffer].data, np.uint8),
                    bias,
                    None
                    if bias is None
                    else np.asarray(model.buffers[bias.buffer].data, np.uint8).view(
                        np.int32
                    ),
                    graph.tensors[op.inputs[0]].quantization.scale[0],
                )
            )
    return found
