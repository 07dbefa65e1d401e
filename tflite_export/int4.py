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
#: The largest int32 bias.
INT32_MAX = 2**31 - 1


def int4_kernels(model_bytes, per_channel=True):
    """`model_bytes` with every int8 FULLY_CONNECTED kernel stored as INT4.

    Kernels that share one buffer (the converter keeps one copy of equal
    bytes) but not one scale get a buffer each; a channel of zeros keeps a
    scale its bias fits (`zero_channel_scales`).

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
    buffers = _Buffers(model)
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
            source = graph.tensors[op.inputs[0]].quantization.scale[0]
            bias = op.inputs[2] if len(op.inputs) > 2 else -1
            bias = graph.tensors[bias] if bias >= 0 else None
            old, new, packed = _pack(buffers, kernel, per_channel, source, bias)
            kernel.buffer = buffers.place(kernel.buffer, packed)
            kernel.type = schema.TensorType.INT4
            _set_scales(kernel, new)
            if bias is not None:
                _rescale_bias(buffers, bias, source, old, new)
            changed = True
    if not changed:
        return model_bytes
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


class _Buffers:
    """A model's buffers as the converter wrote them, rewritten without clashes.

    `original(i)` is buffer i's bytes before any rewrite; `place(i, data)`
    writes `data` into buffer i the first time, keeps it there when a later
    tensor on i wants the same bytes, and otherwise appends a new buffer
    (tensors that shared equal int8 bytes may need different rewrites).
    """

    def __init__(self, model):
        self.model = model
        self.originals = {}
        self.written = {}
        self.biases = {}  # id of a rescaled bias tensor -> its scales

    def original(self, index):
        if index not in self.originals:
            data = self.model.buffers[index].data
            self.originals[index] = np.asarray(data, np.uint8).copy()
        return self.originals[index]

    def place(self, index, data):
        from tensorflow.lite.python import schema_py_generated as schema

        data = np.asarray(data, np.uint8)
        self.original(index)
        if index not in self.written:
            self.model.buffers[index].data = data
            self.written[index] = data
            return index
        if np.array_equal(self.written[index], data):
            return index
        buffer = schema.BufferT()
        buffer.data = data
        self.model.buffers.append(buffer)
        self.written[len(self.model.buffers) - 1] = data
        return len(self.model.buffers) - 1


def _pack(buffers, kernel, per_channel, input_scale, bias):
    """`(old scales, new scales, INT4 bytes)` of an int8 kernel `(C, ...)`."""
    shape = tuple(kernel.shape)
    values = buffers.original(kernel.buffer).view(np.int8)
    values = values.reshape(shape[0], -1).astype(np.float64)
    old = np.broadcast_to(
        np.asarray(kernel.quantization.scale, np.float64), (shape[0],)
    ).copy()
    real = values * old[:, None]
    peak = np.abs(real).max()
    step = peak / INT4_MAX  # one 4-bit scale
    levels = real / step if peak else real
    if peak and np.all(
        np.abs(levels - np.round(levels)) <= old[:, None] / (2 * step) + 1e-6
    ):
        # Trained on that grid (within the int8 rounding of each value): its
        # levels exactly, one scale, whatever `per_channel` asks.
        new = np.full(shape[0], step)
        quantized = np.round(levels)
    else:
        peaks = np.abs(real).max(axis=1) if per_channel else np.full(shape[0], peak)
        new = peaks / INT4_MAX
        floor = zero_channel_scales(old, input_scale, _bias_values(buffers, bias))
        if not per_channel:  # TFLM: one scale, the largest a zero channel needs
            floor = np.full(shape[0], floor.max())
        new = np.where(new > 0, new, floor)
        quantized = np.clip(np.round(real / new[:, None]), -INT4_MAX, INT4_MAX)
    flat = quantized.astype(np.int8).reshape(-1)
    if len(flat) % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    low, high = flat[0::2] & 0x0F, (flat[1::2] & 0x0F) << 4
    return old, new, (low | high).astype(np.uint8)


def zero_channel_scales(old, input_scale, bias):
    """Scales `(C,)` for channels of zeros: the int8 scale in 4-bit steps.

    `old * 127 / 7` is the 4-bit step of a channel that filled the int8
    range; it is raised where needed so that the channel's int32 bias
    (`bias`, int32 `(C,)` or None) still fits on `input scale x scale`.
    """
    scale = old * 127 / INT4_MAX
    if bias is not None:
        real = np.abs(bias.astype(np.float64)) * input_scale * old
        scale = np.maximum(scale, real / (input_scale * INT32_MAX))
    return np.where(scale > 0, scale, 1.0)


def _bias_values(buffers, bias):
    """The int32 bias `(C,)` as the converter wrote it, or None."""
    if bias is None:
        return None
    return buffers.original(bias.buffer).view(np.int32)


def _set_scales(tensor, scales):
    """Per-channel scales, or one scale (all equal) for a per-tensor kernel."""
    q = tensor.quantization
    one = bool(np.all(scales == scales[0]))
    q.scale = (scales[:1] if one else scales).astype(np.float32)
    q.zeroPoint = np.zeros(len(q.scale), np.int64)
    q.quantizedDimension = 0


def _rescale_bias(buffers, bias, input_scale, old, new):
    """The int32 bias on `input scale x new kernel scale` (its own buffer if
    another bias shared its bytes on other scales; once per bias tensor)."""
    scales = (input_scale * new).astype(np.float64)
    if id(bias) in buffers.biases:  # a bias tensor that two ops read
        if not np.allclose(buffers.biases[id(bias)], scales, rtol=1e-6):
            raise ValueError(
                f"{bias.name.decode()}: one bias tensor read by kernels of "
                "different 4-bit scales cannot hold both"
            )
        return
    buffers.biases[id(bias)] = scales
    values = _bias_values(buffers, bias).astype(np.float64)
    # Every new scale is at least the old one x 127 / 7 (a channel's 4-bit
    # step covers its int8 range; a zero channel's is raised to fit), so
    # the rescaled bias fits int32 as the converter's did.
    rescaled = np.round(values * input_scale * old / (input_scale * new))
    data = rescaled.astype(np.int32).view(np.uint8)
    bias.buffer = buffers.place(bias.buffer, data)
    _set_scales(bias, scales)
