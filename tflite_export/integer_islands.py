"""Float islands the converter leaves in a quantization-aware model, made int8.

In quantization-aware mode the TFLite converter has no quantization rule for
DYNAMIC_UPDATE_SLICE (the KV-cache write of a decoding step): it dequantizes
the int8 cache and the int8 new keys and values, writes in float32 and
quantizes the result again. The write moves values and computes nothing, and
the training put the old and the updated cache on one range (the cache's), so
the int8 kernel that calibrated exports use gives the same bytes.
`integer_update_slices` rewires each such island to it: the DEQUANTIZE inputs
feed the write, the write produces the QUANTIZE output, and the conversion
ops go. New rows on a range of their own (the converter merges the cache's
quantizer into the one before it, the rotation's or the projection's) reach
the write through an int8 -> int8 QUANTIZE onto the cache's range: the
requantization the float island did.
"""

import copy

import numpy as np

#: The op this module rewires.
UPDATE = "DYNAMIC_UPDATE_SLICE"


class IslandError(ValueError):
    """A float island whose tensors do not share one int8 range."""


def integer_update_slices(model_bytes, requantize_cache=False):
    """`model_bytes` with every float DYNAMIC_UPDATE_SLICE island made int8.

    An island is `DEQUANTIZE(a), DEQUANTIZE(b) -> DYNAMIC_UPDATE_SLICE ->
    QUANTIZE` of int8 `a`, `b` and output. Sources on a range other than the
    output's reach the write through an int8 -> int8 QUANTIZE (what the
    island computed in float). `requantize_cache`: the old cache `a` may be
    on its own range too (a calibrated export, whose input and output cache
    ranges come from different statistics): a graph input (the cache fed
    in) then takes the output's range, so its feed between steps is a byte
    copy; otherwise it must share the output's. Returns the bytes unchanged
    when there is no island.

    Raises:
        IslandError: without `requantize_cache`, an island whose old and
            updated cache differ in range.
    """
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    names = {
        index: flatbuffer_utils.opcode_to_name(model, index)
        for index in range(len(model.operatorCodes))
    }
    changed = False
    for graph in model.subgraphs:
        producers = {out: op for op in graph.operators for out in op.outputs}
        readers = {}
        for op in graph.operators:
            for tensor in op.inputs:
                readers.setdefault(tensor, []).append(op)
        drop, added = [], []  # added: (requantizing op, the write it feeds)
        for op in graph.operators:
            if names[op.opcodeIndex] != UPDATE:
                continue
            island = _island(graph, op, names, producers, readers)
            if island is None:
                continue
            links = (producers, readers)
            _rewire(graph, op, island, links, (drop, added), requantize_cache)
            changed = True
        operators = []
        for op in graph.operators:
            operators.extend(new for new, before in added if before is op)
            if not _among(op, drop):
                operators.append(op)
        graph.operators = operators
    if not changed:
        return model_bytes
    for index, graph in enumerate(model.subgraphs):
        _drop_unused_tensors(model, index, graph)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _rewire(graph, op, island, links, edits, requantize_cache):
    """Makes one island's write int8 in place: its sources on the output's
    range (the cache fed in sharing it, or requantized onto it). The ops the
    write no longer reads go into `edits[0]`, requantizing ops into `edits[1]`."""
    (sources, quantize), (producers, readers), (drop, added) = island, links, edits
    ranges = {_range(graph.tensors[t]) for t in (sources[0], quantize.outputs[0])}
    if len(ranges) != 1 and not requantize_cache:
        raise IslandError(
            f"{UPDATE} writes int8 tensors of different ranges {sorted(ranges)}"
            ": the old and the updated cache must share one range (a "
            "byte copy between steps); rewiring it would change values"
        )
    target = _range(graph.tensors[quantize.outputs[0]])
    inputs = list(op.inputs)
    for position, source in enumerate(sources):
        dequantize = producers[inputs[position]]
        if position == 0 and source in set(graph.inputs):
            # The cache fed in takes the updated cache's range: the feed
            # between steps is a byte copy, and no cached value is rounded
            # again at every step (each runtime its own way).
            _share_range(graph.tensors[source], graph.tensors[quantize.outputs[0]])
        elif _range(graph.tensors[source]) != target:  # onto the output's
            source = _requantized(graph, source, quantize, op, added)
        inputs[position] = source
        if len(readers[dequantize.outputs[0]]) == 1:
            drop.append(dequantize)
    op.inputs = np.array(inputs, dtype=np.int32)
    op.outputs = np.array(quantize.outputs, dtype=np.int32)
    drop.append(quantize)


def _drop_unused_tensors(model, index, graph):
    """Removes the tensors of subgraph `index` that no op, input or output
    reads (the rewired islands' float tensors: TFLM's planner would still
    give them arena)."""
    used = set(int(t) for t in graph.inputs) | set(int(t) for t in graph.outputs)
    for op in graph.operators:
        for group in (op.inputs, op.outputs, op.intermediates):
            used |= {int(t) for t in (() if group is None else group) if t >= 0}
    if len(used) == len(graph.tensors):
        return
    kept = sorted(used)
    moved = {old: new for new, old in enumerate(kept)}
    graph.tensors = [graph.tensors[i] for i in kept]

    def remap(values):
        return np.array([moved[int(v)] if v >= 0 else v for v in values], np.int32)

    graph.inputs, graph.outputs = remap(graph.inputs), remap(graph.outputs)
    for op in graph.operators:
        op.inputs, op.outputs = remap(op.inputs), remap(op.outputs)
        if op.intermediates is not None and len(op.intermediates):
            op.intermediates = remap(op.intermediates)
    for signature in model.signatureDefs or ():
        if signature.subgraphIndex == index:
            for entry in [*(signature.inputs or ()), *(signature.outputs or ())]:
                entry.tensorIndex = moved[entry.tensorIndex]


def _island(graph, op, names, producers, readers):
    """`(int8 sources of operands 0 and 1, the QUANTIZE op)` or None."""
    sources = []
    for tensor in op.inputs[:2]:
        producer = producers.get(tensor)
        if producer is None or names[producer.opcodeIndex] != "DEQUANTIZE":
            return None
        source = producer.inputs[0]
        if graph.tensors[source].type != _int8():
            return None
        sources.append(source)
    consumers = readers.get(op.outputs[0], [])
    if len(consumers) != 1 or names[consumers[0].opcodeIndex] != "QUANTIZE":
        return None
    quantize = consumers[0]
    if graph.tensors[quantize.outputs[0]].type != _int8():
        return None
    return sources, quantize


def _requantized(graph, source, quantize, write, added):
    """A new int8 tensor: `source` requantized onto the cache's range.

    Appends the tensor (the QUANTIZE output's type and range, the source's
    shape) and records the QUANTIZE op that fills it, to go before `write`.
    """
    from tensorflow.lite.python import schema_py_generated as schema

    tensor = copy.deepcopy(graph.tensors[quantize.outputs[0]])
    tensor.shape = np.array(graph.tensors[source].shape, dtype=np.int32)
    tensor.shapeSignature = None
    tensor.name = graph.tensors[source].name + b"/requantized"
    tensor.buffer = 0  # an activation: the empty buffer
    graph.tensors.append(tensor)
    op = schema.OperatorT()
    op.opcodeIndex = quantize.opcodeIndex
    op.inputs = np.array([source], dtype=np.int32)
    op.outputs = np.array([len(graph.tensors) - 1], dtype=np.int32)
    added.append((op, write))
    return len(graph.tensors) - 1


def _share_range(tensor, other):
    """`tensor` (a graph input) quantized as `other`: its feeds follow it."""
    tensor.quantization = copy.deepcopy(other.quantization)


def _range(tensor):
    """`(scale, zero point)` of a per-tensor int8 tensor."""
    q = tensor.quantization
    return (float(q.scale[0]), int(q.zeroPoint[0]))


def _among(op, ops):
    return any(op is other for other in ops)


def _int8():
    from tensorflow.lite.python import schema_py_generated as schema

    return schema.TensorType.INT8
