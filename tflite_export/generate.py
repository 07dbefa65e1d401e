"""Generation with a converted causal LM, in LiteRT or in the TFLM interpreter.

The host keeps the cache between steps (dequantized to float32; an int8 cache
whose input and output share a scale round-trips exactly) and runs the same
decoding loop and samplers as `CausalLM.generate`.
"""

import json
import re

import numpy as np

from keras_posenc import generation, samplers
from tflite_export._tflm.child import run_worker
from tflite_export.contract import device_contract
from tflite_export.verify import dequantize

#: Interpreters `generate_tflite` can use.
RUNTIMES = ("litert", "tflm")


def generate_tflite(
    model_bytes,
    prompt_ids,
    max_new_tokens,
    runtime="litert",
    sampling=None,
):
    """Prompts and new tokens `(B, P + max_new_tokens)` from a converted LM.

    Args:
        model_bytes: bytes of `convert_causal_lm` (a `decode` signature, and
            `prefill` for LiteRT models).
        prompt_ids: int array `(B, P)` or a list of token lists (rows are
            decoded one after another: the model has batch 1).
        max_new_tokens: int >= 1; each prompt plus its new tokens must fit
            the model's cache length, unless the export streams
            (`convert_causal_lm(streaming=...)`).
        runtime: `"litert"` or `"tflm"` (run in a subprocess, which an
            unsupported op cannot take down with the caller).
        sampling: a `keras_posenc.generation.Sampling`, as `generate` takes
            it (with TFLM, a `Sampler`'s class must be importable: it crosses
            to a child process). Defaults to `None` (greedy).

    Returns:
        An int32 NumPy array, laid out as `CausalLM.generate`'s.
    """
    if not isinstance(model_bytes, (bytes, bytearray)):
        _fail("model_bytes", "bytes of a .tflite model", type(model_bytes).__name__)
    if runtime not in RUNTIMES:
        _fail("runtime", f"one of {RUNTIMES}", runtime)
    sampling = generation.sampling_from(sampling)
    prompts, lengths = generation.check_prompts(prompt_ids, sampling.pad_token_id)
    options = sampling.options(max_new_tokens)
    capacity, vocab_size, signatures, streams = _model_facts(model_bytes)
    if runtime == "tflm" and "prefill" in signatures:
        _fail(
            "model_bytes",
            "a TFLM export (convert_causal_lm(..., target='tflm')) for runtime='tflm'",
            f"a LiteRT export with signatures {sorted(signatures)}",
        )
    generation.check_vocabulary(prompts, lengths, vocab_size)
    total = prompts.shape[1] + max_new_tokens
    if not streams and prompts.shape[1] > capacity:  # a rolling cache: any length
        _fail(
            "prompt_ids",
            f"prompts of at most the cache length {capacity}",
            prompts.shape[1],
        )
    if not streams and total > capacity:
        _fail(
            "max_new_tokens",
            f"at most the cache length {capacity} minus the prompt length "
            f"{prompts.shape[1]}",
            max_new_tokens,
        )
    if runtime == "tflm":
        return tflm_generation(model_bytes, prompts, lengths, options)
    decoder = Decoder(model_bytes, "litert")
    return decode_rows(decoder, prompts, lengths, max_new_tokens, sampling)


def teacher_forced_logits(model_bytes, token_ids, runtime="litert"):
    """The decode step's real logits after each token of `token_ids`.

    Every token goes in through `decode` (position t at step t) whatever the
    model would have chosen, and each runtime carries its own caches from
    step to step, as a device does: two runtimes of one file compared on
    this see every difference of their arithmetic, even where greedy
    decoding would hide it. Fed a runtime's own greedy output, a second
    runtime's argmax at each step says whether it would decode the same.

    Args:
        model_bytes: bytes of `convert_causal_lm` (its `decode` signature).
        token_ids: ints `(T,)`, or `(B, T)` rows each read from empty caches;
            T at most the cache length (any T for a streaming export).
        runtime: `"litert"` or `"tflm"` (in a subprocess).

    Returns:
        float32 `(T, V)` (or `(B, T, V)`): real numbers, scale x (raw - zero
        point).
    """
    if not isinstance(model_bytes, (bytes, bytearray)):
        _fail("model_bytes", "bytes of a .tflite model", type(model_bytes).__name__)
    if runtime not in RUNTIMES:
        _fail("runtime", f"one of {RUNTIMES}", runtime)
    ids = np.asarray(token_ids)
    if ids.ndim not in (1, 2) or not ids.size or ids.dtype.kind not in "iu":
        found = f"shape {ids.shape}, dtype {ids.dtype}"
        _fail("token_ids", "a non-empty (T,) or (B, T) array of int token ids", found)
    capacity, vocab_size, _, streams = _model_facts(model_bytes)
    if ids.min() < 0 or ids.max() >= vocab_size:
        found = f"ids in [{ids.min()}, {ids.max()}]"
        _fail("token_ids", f"ids in [0, vocab_size={vocab_size})", found)
    if not streams and ids.shape[-1] > capacity:
        _fail("token_ids", f"rows of at most the cache length {capacity}", ids.shape)
    rows = ids.reshape(-1, ids.shape[-1])
    if runtime == "litert":
        logits = forced_logits(Decoder(bytes(model_bytes), "litert"), rows)
    else:
        arrays = {"model": np.frombuffer(bytes(model_bytes), np.uint8), "ids": rows}
        results, log, code = run_worker(
            "tflite_export._tflm.teacher", arrays, TFLM_GENERATE_TIMEOUT_SECONDS
        )
        if results is None:
            raise RuntimeError(f"TFLM decoding failed: {_cause(log, code)}")
        logits = results["logits"]
    return logits.reshape(ids.shape + logits.shape[-1:])


def forced_logits(decoder, rows):
    """`(B, T, V)` real logits of `decoder` (a `Decoder`) fed each row of `rows`."""
    found = []
    for row in rows:
        decoder.reset()
        steps = [decoder.run_decode(int(token), t)[0] for t, token in enumerate(row)]
        found.append(np.stack(steps))
    return np.stack(found).astype(np.float32)


def decode_rows(decoder, prompts, lengths, max_new_tokens, sampling):
    """Runs the decoding loop row by row (batch-1 models) with a `Sampling`."""
    total = prompts.shape[1] + max_new_tokens
    out = np.full((len(prompts), total), sampling.pad_token_id, np.int32)
    for b, length in enumerate(lengths):
        decoder.reset()
        row = generation.generate_tokens(
            decoder.prefill,
            decoder.step,
            prompts[b : b + 1, :length],
            lengths[b : b + 1],
            max_new_tokens,
            sampling,
            rows=(b,),  # the row's own random stream, as in CausalLM.generate
        )
        out[b, : row.shape[1]] = row[0]
    return out


def cache_length(model_bytes):
    """The cache length S of a converted LM (its `decode` cache inputs)."""
    return _model_facts(model_bytes)[0]


def _model_facts(model_bytes):
    """`(cache length S, vocabulary V, signature names, streams)` of an LM export."""
    from ai_edge_litert.interpreter import Interpreter

    try:
        contract = device_contract(bytes(model_bytes))
    except ValueError as error:
        _fail(
            "model_bytes",
            "a causal LM export of convert_causal_lm (a decode signature)",
            str(error),
        )
    signatures = Interpreter(model_content=bytes(model_bytes)).get_signature_list()
    facts = contract.cache_length, contract.vocab_size, set(signatures)
    return facts + (contract.streams,)


class Decoder:
    """`prefill` / `step` callables over a converted LM in one interpreter.

    Both interpreters find the decode step's tensors through its
    `tflite_export.device_contract` (LiteRT by name, TFLM by position, as a
    firmware does) and quantize with the contract's scales and zero points.
    """

    def __init__(self, model_bytes, runtime):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        self.contract = device_contract(bytes(model_bytes))
        self.caches = self.contract.caches
        # Builtin kernels, no XNNPACK: the arithmetic TFLM reproduces.
        self.litert = Interpreter(
            model_content=bytes(model_bytes),
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        self.signatures = self.litert.get_signature_list()
        if runtime == "tflm":  # one subgraph: tensors by their position
            from tflite_micro.python.tflite_micro import runtime as micro

            self.micro = micro.Interpreter.from_bytes(
                bytes(model_bytes), arena_size=16 << 20
            )
        else:
            self.micro = None
            self.decode = self.litert.get_signature_runner("decode")
        self.reset()

    def reset(self):
        """Every cache at real zero (its zero point), as a firmware starts."""
        self.state = [
            np.zeros(self.contract.input_port(name).shape, np.float32)
            for name in self.caches
        ]

    def run_decode(self, token, index):
        contract = self.contract
        feeds = {
            "token": np.array([[token]], np.int32),
            "index": np.array(index, np.int32),
        }
        feeds.update(zip(self.caches, self.state))
        raw = {name: contract.input_port(name).quantize(v) for name, v in feeds.items()}
        if self.micro is None:
            results = self.decode(**raw)
        else:
            for name, value in raw.items():
                self.micro.set_input(value, contract.input_port(name).index)
            self.micro.invoke()
            results = {
                port.name: np.array(self.micro.get_output(port.index))
                for port in contract.outputs
            }
        values = {
            name: contract.output_port(name).dequantize(results[name])
            for name in results
        }
        self.state = [values[name] for name in self.caches]
        return values["logits"][:, -1]  # (1, V)

    def prefill(self, tokens):
        if self.micro is None and "prefill" in self.signatures:
            length = tokens.shape[1]
            runner = self.litert.get_signature_runner("prefill")
            details = runner.get_output_details()
            padded = np.zeros(runner.get_input_details()["tokens"]["shape"], np.int32)
            padded[0, :length] = tokens[0]
            results = runner(tokens=padded)
            values = {n: dequantize(results[n], details[n]) for n in results}
            self.state = [values[name] for name in self.caches]
            return values["logits"][:, length - 1]
        logits = None
        for t in range(tokens.shape[1]):  # decode-only: the prompt token by token
            logits = self.run_decode(int(tokens[0, t]), t)
        return logits

    def step(self, tokens, index):
        return self.run_decode(int(tokens[0, 0]), index)


def _fail(name, expectation, value):
    raise ValueError(f"`{name}` must be {expectation}. Received: {name}={value!r}")


#: Seconds a TFLM generation subprocess may run.
TFLM_GENERATE_TIMEOUT_SECONDS = 600


def _portable(options):
    """`options` as JSON can carry them: a `Sampler` instance serialized."""
    sampler = options["sampler"]
    if isinstance(sampler, samplers.Sampler):
        return dict(options, sampler=samplers.serialize(sampler))
    return options


#: TFLM log lines that say why a model did not run.
TFLM_CAUSE = re.compile(r"Didn't find op|failed to prepare|not supported|!=")


def tflm_generation(model_bytes, prompts, lengths, options):
    """Tokens from TFLM in a child process.

    A RuntimeError says why it failed.
    """
    arrays = {
        "model": np.frombuffer(bytes(model_bytes), np.uint8),
        "prompts": prompts,
        "lengths": lengths,
        "options": np.array(json.dumps(_portable(options))),
    }
    results, log, code = run_worker(
        "tflite_export._tflm.generation", arrays, TFLM_GENERATE_TIMEOUT_SECONDS
    )
    if results is None:
        raise RuntimeError(f"TFLM generation failed: {_cause(log, code)}")
    return results["tokens"]


def _cause(log, code):
    """The line of a TFLM child's log that says why it failed."""
    lines = [line for line in log.splitlines() if line.strip()]
    causes = [line for line in lines if TFLM_CAUSE.search(line)]
    return (causes or lines or [f"exit status {code}"])[-1]
