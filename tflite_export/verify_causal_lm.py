"""What a causal LM export costs on the device and how close it reads to Keras."""

import dataclasses

import numpy as np

from keras_posenc import generation
from keras_posenc.models import CausalLM
from tflite_export.contract import device_contract
from tflite_export.firmware import Arena, measure_arena
from tflite_export.generate import Decoder, generate_tflite, tflm_generation
from tflite_export.verify import titled_table


@dataclasses.dataclass
class LMReport:
    """What `verify_causal_lm` measured; `table()` formats it for people."""

    size_bytes: int
    signatures: list
    cache_length: int
    bits_per_token_keras: float
    bits_per_token_litert: float
    arena_bytes: int = None
    arena_bytes_32bit: int = None
    greedy_agreement: float = None

    @property
    def arena(self):
        """The `firmware.Arena` of both figures (None before TFLM ran)."""
        return Arena.of(self.arena_bytes, self.arena_bytes_32bit)

    def _litert_bits(self):
        """The export's bits per token, and how far from Keras' they are."""
        litert, keras = self.bits_per_token_litert, self.bits_per_token_keras
        if not keras:
            return f"{litert:.4f}"
        return f"{litert:.4f} ({100 * (litert / keras - 1):+.2f}% over Keras)"

    def table(self):
        rows = [
            ("flash (the .tflite)", f"{self.size_bytes} bytes"),
            ("signatures", ", ".join(self.signatures)),
            ("cache length S", str(self.cache_length)),
            ("TFLM arena, 64-bit host", _maybe(self.arena_bytes, "{} bytes")),
            ("TFLM arena, 32-bit part", _maybe(self.arena_bytes_32bit, "{} bytes")),
            ("bits per token, Keras", f"{self.bits_per_token_keras:.4f}"),
            ("bits per token, LiteRT", self._litert_bits()),
            ("TFLM greedy tokens = LiteRT's", _maybe(self.greedy_agreement, "{:.2f}")),
        ]
        title = "The causal LM export: its cost, and how it reads the text"
        return titled_table(title + " (tflite_export.verify_causal_lm)", rows)


def verify_causal_lm(model_bytes, keras_model, token_ids):
    """Size, TFLM arena, teacher-forced bits per token and greedy agreement.

    Bits per token (bits per byte for a byte-level LM) are the mean
    `-log2 p(next token)` over `token_ids`, read teacher-forced through the
    export's `decode` step (LiteRT) and through `keras_model`. For a TFLM
    export (a `decode` signature only) the first half of each row is also a
    prompt for greedy generation in TFLM (a subprocess) and in LiteRT:
    `greedy_agreement` is the share of new tokens that agree; `arena_bytes`
    is the smallest arena with which TFLM runs the step on this 64-bit host
    and `arena_bytes_32bit` the figure for a 32-bit part (`measure_arena`).

    Args:
        model_bytes: bytes of `convert_causal_lm`.
        keras_model: the `CausalLM` it was converted from.
        token_ids: int array `(N, L)` of real text, `2 <= L <=` the export's
            cache length, ids in `[0, vocab_size)`.

    Returns:
        An `LMReport`.
    """
    contract, ids = _checked(model_bytes, keras_model, token_ids)
    capacity = contract.cache_length
    decoder = Decoder(bytes(model_bytes), "litert")
    litert = []
    for row in ids:
        decoder.reset()
        logits = [decoder.run_decode(int(token), t)[0] for t, token in enumerate(row)]
        litert.append(np.stack(logits[:-1]))  # (L - 1, V): each next token's
    keras = np.asarray(keras_model.logits(ids))[:, :-1]
    report = LMReport(
        size_bytes=len(model_bytes),
        signatures=sorted(decoder.signatures),
        cache_length=capacity,
        bits_per_token_keras=_bits(keras, ids[:, 1:]),
        bits_per_token_litert=_bits(np.stack(litert), ids[:, 1:]),
    )
    if "prefill" in decoder.signatures:
        return report  # a LiteRT export: TFLM does not run it
    half = max(1, ids.shape[1] // 2)
    prompts, new = ids[:, :half], ids.shape[1] - half
    lengths = np.full(len(ids), half, np.int32)
    options = generation.Sampling().options(new)
    tflm = tflm_generation(model_bytes, prompts, lengths, options)
    arena = measure_arena(model_bytes)
    report.arena_bytes, report.arena_bytes_32bit = arena.bytes, arena.bytes_32bit
    reference = generate_tflite(model_bytes, prompts, new, runtime="litert")
    report.greedy_agreement = float(np.mean(tflm[:, half:] == reference[:, half:]))
    return report


def _checked(model_bytes, keras_model, token_ids):
    """`(device contract, int32 ids)` of `verify_causal_lm`'s checked arguments."""
    if not isinstance(model_bytes, (bytes, bytearray)):
        raise TypeError(
            "`model_bytes` must be bytes of convert_causal_lm. "
            f"Received: {type(model_bytes).__name__}"
        )
    contract = device_contract(bytes(model_bytes))  # refuses cut or foreign bytes
    if not isinstance(keras_model, CausalLM):
        raise TypeError(
            "`keras_model` must be the CausalLM the bytes were converted from. "
            f"Received: {type(keras_model).__name__}"
        )
    ids = np.asarray(token_ids)
    if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.shape[1] < 2:
        raise ValueError(
            "`token_ids` must be integer ids (N, L) with L >= 2. Received: "
            f"shape={ids.shape}, dtype={ids.dtype}"
        )
    capacity = contract.cache_length
    if ids.shape[1] > capacity:
        raise ValueError(
            f"`token_ids` must be at most the cache length {capacity} long. "
            f"Received: L={ids.shape[1]}"
        )
    vocab = keras_model.get_config()["vocab_size"]
    if vocab != contract.vocab_size:
        raise ValueError(
            "`keras_model` must be the CausalLM the bytes were converted from: "
            f"the export's vocabulary is {contract.vocab_size}. Received: a model "
            f"with vocab_size={vocab}"
        )
    generation.check_vocabulary(
        ids, np.full(len(ids), ids.shape[1]), vocab, name="token_ids"
    )
    return contract, ids.astype(np.int32)


def _bits(logits, targets):
    """Mean `-log2 softmax(logits)[target]` (float64, stable)."""
    logits = np.asarray(logits, np.float64)
    logits = logits - logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(logits).sum(axis=-1))
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return float(np.mean(log_z - picked) / np.log(2.0))


def _maybe(value, template):
    return "n/a" if value is None else template.format(value)
