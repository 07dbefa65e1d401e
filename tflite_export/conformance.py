"""One file, one answer: every builder method against every export, measured.

The conformance matrix: a row per `position=` method of the method table
and per decoder block (`BLOCKS`), a column per export (`EXPORTS`). Each
row gets a small causal LM trained on counting sequences
(`keras_posenc.data.recipes.counting_lm`: a task with one right answer, so
its logits are far from ties), and each cell either
is refused by name before converting (the exporter's own reason), or is
exported and measured:

- greedy tokens of 8 prompts against the Keras model's (`keras`: the share
  equal, the exported model being the Keras model of its column: the QAT
  model for the QAT column, the grouped-query one for grouped-query);
- for a TFLM file, the same file in LiteRT and in TFLM, both teacher-forced
  through LiteRT's greedy output, each on its own caches: the share of new
  tokens TFLM's argmax gives too (`runtimes`: 1.0 is TFLM decoding LiteRT's
  tokens) and the largest difference of their logits in int8 steps
  (`steps`; the runtimes round a requantization apart at halves,
  docs/edge.md).

`python -m tflite_export.conformance` prints the matrix as Markdown
(`docs/conformance.md` is its output; `tests/export/test_export_conformance.py`
holds the two together and checks every cell's claims).
"""

import dataclasses
import sys

import numpy as np

from keras_posenc.data import recipes, synthetic
from keras_posenc.generation import Streaming
from keras_posenc.models.capabilities import block_capabilities, capabilities
from keras_posenc.models.methods import METHODS
from tflite_export.causal_lm import convert_causal_lm
from tflite_export.contract import device_contract
from tflite_export.convert import ExportError
from tflite_export.generate import generate_tflite, teacher_forced_logits
from tflite_export.qat import quantize_aware

#: Decoder-block rows (`block_options`): a family's block at the matrix's
#: size, `{row: build_causal_lm arguments}` (beside `position`). The Llama
#: row carries the per-layer positions: a NoPE layer and p-RoPE. (With RoPE
#: on both layers, its streaming int8 TFLM file gave LiteRT's token on 47 of
#: 48 steps: LiteRT's top two logits were one int8 step apart there, and the
#: runtimes differ by up to six, docs/edge.md; a near-tie, not a kernel.)
#: Llama's block: RMS pre-norm, SwiGLU, no biases (three rows start from it).
LLAMA = dict(norm="rms", norm_first=True, gated=True, activation="silu", use_bias=False)
BLOCKS = {
    "gemma3_block": dict(
        position="rope",
        block_options=dict(
            norm="rms",
            norm_first=True,
            norm_unit_offset=True,
            post_norms=True,
            gated=True,
            activation="gelu_tanh",
            use_bias=False,
            qk_norm=True,
            tie_embeddings=True,
            scale_embeddings=True,
            layer_types=["sliding", "full"],
            sliding_window=4,
        ),
        position_options={"layer_rope": {"full": {"max_wavelength": 1e6}}},
    ),
    "gpt2_block": dict(
        position="learned",
        block_options=dict(norm_first=True, activation="gelu_tanh"),
    ),
    "llama_block": dict(
        position="rope",
        block_options=LLAMA,
        position_options={
            "nope_layers": [1],
            "layer_rope": {
                "full": {
                    "rope_type": "proportional",
                    "rope_parameters": {"partial_rotary_factor": 0.5},
                }
            },
        },
    ),
    "gpt_oss_block": dict(
        position="rope",
        block_options=dict(
            LLAMA,
            qkv_bias=True,
            attention_sinks=True,
            layer_types=["sliding", "full"],
            sliding_window=4,
        ),
        position_options={
            "rope_type": "yarn",
            "scaling_factor": 2.0,
            "original_max_position_embeddings": 8,
        },
    ),
    "llama4_block": dict(
        position="rope",
        block_options=dict(
            LLAMA,
            nope_temperature={"floor_scale": 2.0, "attn_scale": 0.5},
        ),
        position_options={"nope_layers": [1]},
    ),
}
#: The matrix's rows: every method, then every decoder block.
ROWS = (*METHODS, *BLOCKS)
#: Training batches of each method's models (120 fit the task exactly).
TRAIN_STEPS = 120
#: Key and value heads of the grouped-query column's model (4 query heads).
KV_HEADS = 2
#: The cache length of the exports that do not stream.
MAX_LENGTH = 16
#: The streaming column's rolling cache (it wraps while the prompts decode).
STREAMING = Streaming(cache_window=8, sink_tokens=2)
#: Greedy decoding: prompts, their length and the new tokens of each.
PROMPTS, PROMPT_LENGTH, NEW_TOKENS = 8, 4, 12
#: Seeds of the training data and of the held-out prompts and calibration.
TRAIN_SEED, TEST_SEED = 0, 99


@dataclasses.dataclass(frozen=True)
class Export:
    """One column: which model is exported, how, and where it runs.

    `needs` are the `keras_posenc.models.capabilities.Capabilities` fields
    that say a method has this export (the README's capability table).
    """

    mode: str
    target: str
    needs: tuple
    model: str = "float"  # "float", "qat" or "grouped"
    streaming: bool = False

    @property
    def runtimes(self):
        """The runtimes that run the file: TFLM files run in LiteRT too."""
        return ("litert", "tflm") if self.target == "tflm" else ("litert",)


#: The matrix's columns, in order.
EXPORTS = {
    "float32 LiteRT": Export("float32", "litert", ("causal_lm",)),
    "int8 LiteRT": Export("int8", "litert", ("int8",)),
    "int8 TFLM": Export("int8", "tflm", ("int8",)),
    "int4 LiteRT": Export("int4", "litert", ("int8",)),
    "int4 TFLM": Export("int4", "tflm", ("int8",)),
    "QAT int8 TFLM": Export("int8", "tflm", ("qat",), model="qat"),
    "streaming int8 TFLM": Export(
        "int8", "tflm", ("int8", "streaming"), streaming=True
    ),
    "grouped-query int8 TFLM": Export(
        "int8", "tflm", ("int8", "grouped_query"), model="grouped"
    ),
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One method's measure of one export, or the exporter's refusal."""

    method: str
    column: str
    refusal: str = None
    keras: float = None
    runtimes: float = None
    steps: float = None

    @property
    def supported(self):
        return self.refusal is None

    def text(self, note=None):
        """The table's cell: `keras` share (and TFLM's steps), or the refusal."""
        if not self.supported:
            return f"refused ({note})" if note else "refused"
        if self.steps is None:
            return f"{self.keras:.2f}"
        return f"{self.keras:.2f} / {self.steps:g}"


@dataclasses.dataclass
class Data:
    """The task's held-out prompts and calibration ids."""

    prompts: np.ndarray  # (PROMPTS, PROMPT_LENGTH)
    calibration: np.ndarray  # (4, MAX_LENGTH)

    @classmethod
    def make(cls):
        vocab = recipes.COUNTING_LM["vocab_size"]
        rows = synthetic.counting_sequences(12, MAX_LENGTH, vocab, TEST_SEED)
        return cls(rows[:PROMPTS, :PROMPT_LENGTH], rows[PROMPTS:])


def method_models(method, steps=TRAIN_STEPS):
    """`{"float", "qat", "grouped"}`: the models of `method`'s columns.

    A model the package refuses to build (grouped-query recursive blocks)
    or to make quantization-aware is the refusal's text instead.
    """
    block = dict(BLOCKS.get(method, {"position": method}))
    position = block.pop("position")
    models = {"float": recipes.counting_lm(position, steps, TRAIN_SEED, **block)}
    try:
        models["grouped"] = recipes.counting_lm(
            position, steps, TRAIN_SEED, num_key_value_heads=KV_HEADS, **block
        )
    except ValueError as error:
        models["grouped"] = _reason(error)
    try:
        models["qat"] = _ranged(quantize_aware(models["float"]))
    except (ExportError, ValueError) as error:
        models["qat"] = _reason(error)
    return models


def _ranged(qat):
    """`qat` with every range from one training-mode batch (weights unchanged)."""
    vocab = recipes.COUNTING_LM["vocab_size"]
    rows = synthetic.counting_sequences(64, 17, vocab, TRAIN_SEED + 1)
    qat(rows[:, :-1], training=True)
    return qat


def measure(method, models, data):
    """`({column: Cell}, {column: the exported bytes})` of one method."""
    cells, files, expected = {}, {}, {}
    for column, export in EXPORTS.items():
        model = models[export.model]
        if isinstance(model, str):
            cells[column] = Cell(method, column, refusal=model)
            continue
        try:
            model_bytes = _convert(model, export, data)
        except (ExportError, ValueError) as error:
            cells[column] = Cell(method, column, refusal=_reason(error))
            continue
        files[column] = model_bytes
        key = (export.model, export.streaming)  # one Keras decoding each
        if key not in expected:
            streaming = STREAMING if export.streaming else None
            tokens = model.generate(data.prompts, NEW_TOKENS, streaming=streaming)
            expected[key] = np.asarray(tokens)
        cells[column] = _measured(method, column, expected[key], model_bytes, data)
    return cells, files


def _convert(model, export, data):
    calibration = None if export.model == "qat" else data.calibration
    if export.streaming:
        length = {"streaming": STREAMING}
    else:
        length = {"max_length": MAX_LENGTH}
    return convert_causal_lm(
        model, calibration, export.mode, target=export.target, **length
    )


def _measured(method, column, expected, model_bytes, data):
    export = EXPORTS[column]
    rows = generate_tflite(model_bytes, data.prompts, NEW_TOKENS, runtime="litert")
    new = slice(PROMPT_LENGTH, None)
    keras_share = float(np.mean(rows[:, new] == expected[:, new]))
    if export.target != "tflm":
        return Cell(method, column, keras=keras_share)
    same, steps = runtime_agreement(model_bytes, rows, PROMPT_LENGTH)
    return Cell(method, column, keras=keras_share, runtimes=same, steps=steps)


def runtime_agreement(model_bytes, rows, prompt_length):
    """`(share, steps)` of a TFLM file on LiteRT's greedy `rows` `(B, T)`.

    Both runtimes read `rows` teacher-forced, each on its own caches.
    `share`: how many of the new tokens TFLM's argmax gives (all of them:
    TFLM greedy decodes LiteRT's tokens, each step fed what LiteRT fed);
    `steps`: the largest `|TFLM - LiteRT|` logit, in the logits' int8 steps.
    """
    litert = teacher_forced_logits(model_bytes, rows, "litert")
    tflm = teacher_forced_logits(model_bytes, rows, "tflm")
    chosen = tflm[:, prompt_length - 1 : -1].argmax(-1)  # (B, new tokens)
    share = float(np.mean(chosen == rows[:, prompt_length:]))
    scale = device_contract(model_bytes).output_port("logits").scale or 1.0
    return share, float(np.round(np.abs(tflm - litert).max() / scale, 3))


def expected_support(method):
    """`{column: bool}`: what the capability table says of `method` (or of a
    block row: `models.capabilities.block_capabilities`)."""
    if method in BLOCKS:
        block = dict(BLOCKS[method])
        record = block_capabilities(
            block.pop("position"), recipes.COUNTING_LM["num_layers"], **block
        )
    else:
        record = capabilities(method)
    return {
        column: all(getattr(record, need) for need in export.needs)
        for column, export in EXPORTS.items()
    }


def _reason(error):
    """An error's message, its first sentence of the first line."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text.split(". Received")[0].strip()


def matrix_table(rows):
    """Markdown: the matrix of `rows` (`{method: {column: Cell}}`) and its notes."""
    notes = {}
    lines = [
        "| method | " + " | ".join(EXPORTS) + " |",
        "|---" * (len(EXPORTS) + 1) + "|",
    ]
    for method, cells in rows.items():
        texts = []
        for column in EXPORTS:
            cell = cells[column]
            note = None
            if not cell.supported:
                note = notes.setdefault(cell.refusal, chr(ord("a") + len(notes)))
            texts.append(cell.text(note))
        lines.append(f"| `{method}` | " + " | ".join(texts) + " |")
    lines.append("")
    lines += [f"- ({note}) {reason}" for reason, note in notes.items()]
    return "\n".join(lines)


#: The page `main` prints above the table (`docs/conformance.md`).
PAGE = """# Conformance: every method, every export, every runtime

Generated by `python -m tflite_export.conformance > docs/conformance.md`
(Keras 3, seeded); `tests/export/test_export_conformance.py` measures every
cell again and holds this page to the code (the Keras 2 pass checks its own
models' cells against the same floors).

Each method's model: `keras_posenc.data.recipes.counting_lm` ({steps} batches
of counting sequences; D=32, 2 layers, 4 heads, vocabulary 24), its
quantization-aware copy (`tflite_export.quantize_aware`, its ranges from one
training-mode batch; `tests/export/test_export_qat_lm.py` trains QAT models)
and a grouped-query twin ({kv} key heads). A cell is `keras / steps`:

- `keras`: the share of greedy tokens (8 prompts of {prompt} tokens, {new} new
  tokens each) equal to the Keras model's (the float, QAT or grouped-query one);
- `steps` (TFLM files): the largest difference between TFLM's and LiteRT's
  logits on the same file, both teacher-forced through LiteRT's greedy
  tokens with each runtime on its own caches, in the logits' int8 steps.
  TFLM rounds each requantization twice (gemmlowp's rule) and LiteRT's
  builtin kernels otherwise at halves (`docs/edge.md`); TFLM decodes
  LiteRT's greedy tokens in every cell (the test asserts it).

`refused (x)`: the exporter refuses it by name before converting; its reason
is listed under the table. The refusals are exactly the README capability
table's `-` cells (int8, QAT, streaming, grouped-query): the test holds them.

The `_block` rows are decoder blocks (`block_options`, `docs/decoders.md`) of
the same size trained the same way: Gemma 3's (QK and post norms, `(1 + w)`
scales, GeGLU, tied and scaled embeddings, a sliding and a full layer with
their own bases),
GPT-2's (LayerNorm pre-norm, GELU, learned positions), and three with RMS
pre-norm and SwiGLU carrying the per-layer positions: Llama's (p-RoPE on
half the slots of its first layer, no positions in its second: NoPE),
gpt-oss's (learned attention sinks, q/k/v biases, a sliding and a full
layer, YaRN) and Llama 4's (a NoPE layer with its attention temperature);
their support is `models.capabilities.block_capabilities`.
"""


def page(rows):
    """The whole Markdown page of `rows` (`{method: {column: Cell}}`)."""
    head = PAGE.format(
        steps=TRAIN_STEPS,
        kv=KV_HEADS,
        prompt=PROMPT_LENGTH,
        new=NEW_TOKENS,
    )
    return head + "\n" + matrix_table(rows) + "\n"


def main(argv=None):
    """Trains every method's models, measures every cell, prints the page."""
    argv = sys.argv[1:] if argv is None else argv
    methods = argv or list(ROWS)
    data = Data.make()
    rows = {}
    for method in methods:
        rows[method] = measure(method, method_models(method), data)[0]
        print(f"measured {method}", file=sys.stderr)
    print(page(rows), end="")


if __name__ == "__main__":
    main()
