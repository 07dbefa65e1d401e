"""4-bit weights: the int8 kernels of a full-int8 model rewritten as INT4.

`int4_kernels` takes a full-int8 TFLite model (int8 activations, int8
per-channel kernels of `[-127, 127]`) and stores each FULLY_CONNECTED kernel
as INT4 (`[-7, 7]`, two values a byte, the first in the low nibble), its
scale `max |w| / 7` and its int32 bias rescaled to `input scale x kernel
scale`. A kernel trained on one 4-bit grid (`CausalLM(quantize="int4")`;
the converter stores its 15 levels in int8, per channel) is recognized (each
value within its int8 rounding of a level of `max |w| / 7`) and keeps those
levels and that one scale exactly. Activations stay int8. Measured on this
machine (`docs/edge.md`):
LiteRT runs INT4 kernels with per-channel scales; TFLM's FULLY_CONNECTED
runs INT4 kernels with one scale per tensor only (its prepare refuses a
per-channel INT4 filter), so `per_channel=False` for microcontrollers.
"""

import numpy as np

#: The op whose kernels become INT4.
KERNEL_OPS = ("FULLY_CONNECTED",)
#: The largest magnitude of a symmetric 4-bit value.
INT4_MAX = 7


def int4_kernels(model_bytes, per_channel=True):
    """`model_bytes` with every int8 FULLY_CONNECTED kernel stored as INT4.

    Args:
        model_bytes: a full-int8 TFLite model.
        per_channel: bool, one scale per output channel (LiteRT) or one per
            kernel (TFLM).

    Returns:
        The rewritten model's bytes (unchanged when no kernel qualifies).
    """
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    done = {}  # buffer index -> (int8 values' old scales, new scales)
    changed = False
    for graph in model.subgraphs:
        for op in graph.operators:
            name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
            if name not in KERNEL_OPS or len(op.inputs) < 2:
                continue
            kernel = graph.tensors[op.inputs[1]]
            data = model.buffers[kernel.buffer].data
            if kernel.type != schema.TensorType.INT8 or data is None or not len(data):
                continue
            if kernel.buffer not in done:
                done[kernel.buffer] = _pack(model, kernel, per_channel)
            old, new = done[kernel.buffer]
            kernel.type = schema.TensorType.INT4
            _set_scales(kernel, new)
            bias = op.inputs[2] if len(op.inputs) > 2 else -1
            if bias >= 0:
                source = graph.tensors[op.inputs[0]].quantization.scale[0]
                _rescale_bias(model, graph.tensors[bias], source, old, new, done)
            changed = True
    if not changed:
        return model_bytes
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _pack(model, kernel, per_channel):
    """Writes the kernel's INT4 bytes; returns its old and new scales `(C,)`."""
    shape = tuple(kernel.shape)
    values = np.asarray(model.buffers[kernel.buffer].data, np.uint8).view(np.int8)
    values = values.reshape(shape[0], -1).astype(np.float64)
    old = np.broadcast_to(
        np.asarray(kernel.quantization.scale, np.float64), (shape[0],)
    ).copy()
    real = values * old[:, None]
    step = max(np.abs(real).max(), 1e-12) / INT4_MAX  # one 4-bit scale
    levels = real / step
    if np.all(np.abs(levels - np.round(levels)) <= old[:, None] / (2 * step) + 1e-6):
        # Trained on that grid (within the int8 rounding of each value): its
        # levels exactly, one scale, whatever `per_channel` asks.
        new = np.full(shape[0], step)
        quantized = np.round(levels)
    else:
        peak = np.abs(real).max(axis=1) if per_channel else np.abs(real).max()
        new = np.broadcast_to(np.maximum(peak, 1e-12) / INT4_MAX, (shape[0],)).copy()
        quantized = np.clip(np.round(real / new[:, None]), -INT4_MAX, INT4_MAX)
    flat = quantized.astype(np.int8).reshape(-1)
    if len(flat) % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    low, high = flat[0::2] & 0x0F, (flat[1::2] & 0x0F) << 4
    model.buffers[kernel.buffer].data = (low | high).astype(np.uint8)
    return old, new


def _set_scales(tensor, scales):
    """Per-channel scales, or one scale (all equal) for a per-tensor kernel."""
    q = tensor.quantization
    one = bool(np.all(scales == scales[0]))
    q.scale = (scales[:1] if one else scales).astype(np.float32)
    q.zeroPoint = np.zeros(len(q.scale), np.int64)
    q.quantizedDimension = 0


def _rescale_bias(model, bias, input_scale, old, new, done):
    """The int32 bias on `input scale x new kernel scale` (once per buffer)."""
    key = ("bias", bias.buffer)
    if key not in done:
        values = np.asarray(model.buffers[bias.buffer].data, np.uint8).view(np.int32)
        real = values.astype(np.float64) * input_scale * old
        rescaled = np.round(real / (input_scale * new)).astype(np.int32)
        model.buffers[bias.buffer].data = rescaled.view(np.uint8)
        done[key] = True
    _set_scales(bias, (input_scale * new).astype(np.float64))
