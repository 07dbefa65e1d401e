"""Command line: convert, verify and write a saved model.

    python -m tflite_export MODEL.keras --calibration DATA.npz --out OUT.tflite \
        [--mode int8|int16x8|float32|int4] [--sequence-length T] [--c-array] [--force] \
        [--target litert|tflm] [--max-length S | --cache-window W [--sink-tokens K]]

DATA.npz holds the inputs under `x` and optionally labels under `y` (which
turn on accuracy reporting). A causal language model
(`keras_posenc.models.build_causal_lm`) is exported with its KV cache
(`tflite_export.convert_causal_lm`): `x` holds token sequences, `--max-length`
sets the cache length (or `--cache-window` and `--sink-tokens` a rolling
cache: the step streams past it) and `--target` picks LiteRT (prefill and
decode signatures) or TFLM (one decode step); the file is written once greedy
generation from the first sequence runs in LiteRT, and in TFLM for `tflm`
(a streaming step generates twice its cache length).
It prints the decode step's device contract (`tflite_export.device_contract`)
and, with `--c-array`, writes it as OUT_decode.h beside OUT.cc and OUT.h.
Everything is checked before work starts; nothing is written unless the
model converts and runs in TFLM, and then only atomically (temporary file,
then rename). Exit codes: 0 success, 2 bad input, 1 a model that cannot be
exported.
"""

import argparse
import os
import pathlib
import signal
import sys
import tempfile

import numpy as np

BAD_INPUT, EXPORT_FAILED = 2, 1


def parse_args(argv):
    from tflite_export.convert import MODES

    parser = argparse.ArgumentParser(
        prog="python -m tflite_export",
        description="Converts a saved .keras model to TFLite, checks it in LiteRT "
        "and TFLM, and writes it (and its C array with --c-array).",
    )
    parser.add_argument("model", type=pathlib.Path, help="a saved .keras model")
    parser.add_argument(
        "--calibration",
        type=pathlib.Path,
        required=True,
        help="calibration data: an .npz with the inputs under `x` (and integer "
        "labels under `y`, which turn on accuracy reporting) or an .npy of the "
        "inputs; for a causal LM, token ids (N, L)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        required=True,
        help="the .tflite file to write (--c-array writes OUT.cc and OUT.h "
        "beside it, and OUT_decode.h for a causal LM)",
    )
    parser.add_argument(
        "--mode", choices=MODES, default="int8", help="quantization (default int8)"
    )
    parser.add_argument(
        "--sequence-length",
        type=_positive_int,
        default=None,
        help="the fixed input length T of the exported model (inputs of "
        "--calibration are cut or padded to it; default: their length)",
    )
    parser.add_argument(
        "--c-array",
        action="store_true",
        help="also write OUT.cc (the aligned array) and OUT.h (its declarations, "
        "the model's ops and the smallest TFLM arena)",
    )
    parser.add_argument(
        "--name",
        default="g_model",
        help="the C symbol of the array and the prefix of the headers' macros "
        "(default g_model)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite outputs")
    _add_lm_arguments(parser)
    return parser.parse_args(argv)


def _add_lm_arguments(parser):
    """The flags of a causal LM's export: target, cache length, streaming."""
    parser.add_argument(
        "--target",
        choices=("litert", "tflm"),
        default=None,
        help="causal LMs: LiteRT (prefill and decode) or TFLM (one decode step); "
        "default litert",
    )
    parser.add_argument(
        "--max-length",
        type=_positive_int,
        default=None,
        help="causal LMs: the cache length (default 64)",
    )
    parser.add_argument(
        "--cache-window",
        type=_positive_int,
        default=None,
        help="causal LMs: stream through a rolling cache of the last W tokens",
    )
    parser.add_argument(
        "--sink-tokens",
        type=_natural_int,
        default=None,
        help="with --cache-window: the first tokens the cache keeps (default 4)",
    )


def _natural_int(text):
    """An argparse type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, not {text!r}")
    return value


def _positive_int(text):
    """An argparse type: a whole number >= 1 (0 and negatives are refused)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return value


def check_paths(args):
    """Every path problem, found before anything is loaded or converted."""
    from tflite_export.firmware import check_c_name

    if args.out.is_dir() or not args.out.name or args.out.name in (".", ".."):
        return f"--out {args.out} is a folder; name a file"
    try:
        check_c_name(args.name, "--name")
    except ValueError as error:
        return str(error)
    arrays = [args.out.with_suffix(".cc"), args.out.with_suffix(".h")]
    outputs = [args.out] + (arrays if args.c_array else [])
    if not args.model.is_file():
        return f"the model file {args.model} does not exist"
    if not args.calibration.is_file():
        return f"the calibration file {args.calibration} does not exist"
    if args.c_array and args.out.suffix in (".cc", ".h"):
        return (
            f"--out {args.out} ends in {args.out.suffix}, where --c-array writes "
            "the C array and its header"
        )
    inputs = {args.model.resolve(), args.calibration.resolve()}
    for path in outputs:
        if path.resolve() in inputs:
            return f"--out {path} is an input of this export; choose another name"
        if path.is_dir():
            return f"--out {path} is a folder; name a file"
        if not path.parent.is_dir():
            return f"the output folder {path.parent} does not exist"
        if path.exists() and not args.force:
            return f"{path} exists; pass --force to overwrite it"
        if not writable(path.parent):
            return f"cannot write in the output folder {path.parent}"
    return None


def writable(folder):
    """Whether a file can be created in `folder` (probed, then removed)."""
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".tflite_export.")
    except OSError:
        return False
    os.close(handle)
    os.unlink(probe)
    return True


def load_calibration(path):
    """`(x, y or None)` from an .npz file (`x`, optional `y`) or an .npy of `x`."""
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as error:
        raise ValueError(
            f"{path} is not a readable .npz or .npy file: {error}"
        ) from error
    if isinstance(data, np.ndarray):
        return data, None
    if "x" not in data.files:
        raise ValueError(f"{path} must hold the inputs under `x`. Found: {data.files}")
    return data["x"], data["y"] if "y" in data.files else None


def check_labels(model, x, y):
    """Labels must be integers shaped as the model's predictions: (N,) or (N, T)."""
    if y is None:
        return
    want = (len(x),) + tuple(model.outputs[0].shape[1:-1])
    want = tuple(x.shape[1] if size is None else size for size in want)
    if y.shape != want or y.dtype.kind not in "iu":
        raise ValueError(
            f"`y` must be integer labels of shape {want} (one per prediction). "
            f"Received: shape={y.shape}, dtype={y.dtype}"
        )


def load_model(path):
    import tensorflow as tf

    import keras_posenc  # registers the package's layers

    try:
        return tf.keras.models.load_model(path, compile=False)
    except Exception as first:
        hint = _hint(first, path)
        problem = ValueError(f"cannot load {path}: {_first_line(first)}{hint}")
        if keras_posenc.IS_KERAS_3:
            raise problem from first
        from tflite_export.qat import quantize_scope

        try:
            with quantize_scope():  # a saved QAT model
                return tf.keras.models.load_model(path, compile=False)
        except Exception:
            raise problem from first


def _first_line(error, limit=300):
    text = str(error).strip().splitlines() or [type(error).__name__]
    return text[0][:limit]


def _hint(error, path=None):
    """The fix for a file saved by the other Keras mode, when that is the cause.

    The `.keras` file's `metadata.json` names the Keras that saved it; errors
    of a cross-mode load vary ("Could not locate class", "loss_scale_factor is
    not a valid argument", "expected 2 variables"), the version does not.
    """
    import keras_posenc

    saved = _saved_keras_version(path)
    running = 3 if keras_posenc.IS_KERAS_3 else 2
    other = saved is not None and int(saved.split(".")[0]) != running
    if other or "Could not locate class" in str(error):
        return (
            " (a .keras file loads only in the Keras mode that saved it"
            + (f": saved by Keras {saved}, running Keras {running}" if other else "")
            + "; set or unset TF_USE_LEGACY_KERAS=1 to match)"
        )
    return ""


def _saved_keras_version(path):
    """The `keras_version` in a `.keras` file's metadata, or None."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return str(json.loads(archive.read("metadata.json"))["keras_version"])
    except (OSError, KeyError, ValueError, TypeError, zipfile.BadZipFile):
        return None


class Interrupted(BaseException):
    """SIGTERM, raised where the export is so that its clean-ups run."""


def _interrupt(signum, frame):
    raise Interrupted(signum)


def main(argv=None):
    """Exit code of the export; one `error:` line, never a traceback.

    SIGTERM (and Ctrl-C) stop the export with its clean-ups: the temporary
    output file is removed and the TFLM worker is killed.
    """
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _export(parse_args(argv))
    except (Interrupted, KeyboardInterrupt) as stop:
        number = stop.args[0] if isinstance(stop, Interrupted) else signal.SIGINT
        print(
            f"error: interrupted (signal {number}); nothing was written",
            file=sys.stderr,
        )
        return 128 + number
    except Exception as error:  # a fault nothing above foresaw
        print(f"error: {type(error).__name__}: {_first_line(error)}", file=sys.stderr)
        return EXPORT_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)


def _export(args):
    problem = check_paths(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return BAD_INPUT
    import tflite_export
    from keras_posenc.models import CausalLM
    from tflite_export.convert import check_representative_data

    try:
        x, y = load_calibration(args.calibration)
        model = load_model(args.model)
        if isinstance(model, CausalLM):
            return _export_causal_lm(args, model, x)
        lm_only = (args.target, args.max_length, args.cache_window, args.sink_tokens)
        if any(value is not None for value in lm_only):
            raise ValueError(
                "--target, --max-length, --cache-window and --sink-tokens are for "
                f"causal language models; {args.model} is a {type(model).__name__}"
            )
        data = check_representative_data(model, x, args.sequence_length)
        check_labels(model, data, y)
    except (ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return BAD_INPUT
    try:
        model_bytes = tflite_export.convert(model, data, args.mode)
    except tflite_export.ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXPORT_FAILED
    static = tflite_export.static_model(model, data.shape[1:], data.dtype)
    report = tflite_export.verify(model_bytes, static, data, y)
    print(report.table())
    if not report.tflm_ok:
        print(f"error: TFLM cannot run the model: {report.tflm_error}", file=sys.stderr)
        return EXPORT_FAILED
    return write_outputs(args, model_bytes, report.arena)


def write_outputs(args, model_bytes, arena_bytes, extra=()):
    """Writes `--out`, the C array and `extra` `(path, text)`: all or none.

    Returns the exit code 0.
    """
    from tflite_export import c_array
    from tflite_export.firmware import model_ops

    files = [(args.out, model_bytes)]
    if args.c_array:
        source, header = args.out.with_suffix(".cc"), args.out.with_suffix(".h")
        files += [
            (header, c_array.c_header(args.name, model_ops(model_bytes), arena_bytes)),
            (source, c_array.c_source(model_bytes, args.name, header.name)),
            *extra,
        ]
    c_array.atomic_write_all(files, force=args.force)
    print(f"wrote {args.out} ({len(model_bytes)} bytes)")
    for path, _ in files[1:]:
        print(f"wrote {path}")
    return 0


def _export_causal_lm(args, model, x):
    """Converts a causal LM, checks generation on the device, reports, writes it."""
    import tflite_export
    from tflite_export.causal_lm import check_calibration_ids

    streaming, length = _lm_cache(args, model)
    ids = check_calibration_ids(model, x)
    target = _lm_target(args)
    try:
        model_bytes = tflite_export.convert_causal_lm(
            model,
            ids,
            args.mode,
            None if streaming else length,
            target,
            streaming=streaming,
        )
    except tflite_export.ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXPORT_FAILED
    prompt = [ids[0, : max(1, min(ids.shape[1], length // 2))].tolist()]
    new = (2 if streaming else 1) * length - len(prompt[0])
    runtimes = ("litert", "tflm") if target == "tflm" else ("litert",)
    tokens = {}
    for runtime in runtimes:
        try:
            tokens[runtime] = tflite_export.generate_tflite(
                model_bytes, prompt, new, runtime
            )
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXPORT_FAILED
    text = ids[:, : min(ids.shape[1], length)]  # the report reads it teacher-forced
    arena = None
    if text.shape[1] >= 2:  # flash, arena, bits per token against Keras
        report = tflite_export.verify_causal_lm(model_bytes, model, text)
        print(report.table())
        arena = report.arena
    _print_tokens(model, tokens, len(prompt[0]))
    contract = tflite_export.device_contract(model_bytes)
    print(contract.table())
    extra = []
    if args.c_array:
        if arena is None:  # rows of one token: no report, measured here
            arena = contract.arena
        extra = [(contract_header(args.out), contract.c_header(args.name, arena))]
    return write_outputs(args, model_bytes, arena, extra)


def _lm_cache(args, model):
    """`(streaming or None, cache length)` of an LM export's flags."""
    from keras_posenc import generation
    from tflite_export.causal_lm import LM_MODES

    if args.mode not in LM_MODES:
        raise ValueError(
            f"--mode must be one of {LM_MODES} for a causal LM, not {args.mode}"
        )
    if args.cache_window is None:
        if args.sink_tokens is not None:
            raise ValueError("--sink-tokens goes with --cache-window")
        return None, 64 if args.max_length is None else args.max_length
    if args.max_length is not None:
        raise ValueError("--max-length and --cache-window exclude each other")
    sink = 4 if args.sink_tokens is None else args.sink_tokens
    streaming = generation.Streaming(args.cache_window, sink)
    return streaming, model.check_streaming(streaming)[1]  # the cache's slots


def _lm_target(args):
    """The LM export's target; `--c-array`'s header checked before any work."""
    header = contract_header(args.out)
    if args.c_array and header.exists() and not args.force:
        raise ValueError(f"{header} exists; pass --force to overwrite it")
    inputs = {args.model.resolve(), args.calibration.resolve()}
    if args.c_array and header.resolve() in inputs:
        raise ValueError(f"{header} is an input of this export; choose another --out")
    target = args.target or "litert"
    if args.c_array and target != "tflm":
        raise ValueError(
            "--c-array writes a microcontroller's files: pass --target tflm "
            f"(received --target {target})"
        )
    return target


def _print_tokens(model, tokens, prompt_length):
    """Each runtime's greedy tokens (and text, for a byte-level LM) as rows."""
    from keras_posenc.data import language_modeling

    bytes_level = model.get_config()["vocab_size"] == language_modeling.VOCAB_SIZE
    for runtime, found in tokens.items():
        new_ids = found[0, prompt_length:].tolist()
        print(f"| {runtime} greedy tokens | {new_ids} |")
        if bytes_level:  # a byte-level LM: the ids are UTF-8 bytes
            print(f"| {runtime} greedy text | {language_modeling.text_of(new_ids)!r} |")
    if len(tokens) == 2:
        same = bool((tokens["litert"] == tokens["tflm"]).all())
        print(f"| TFLM == LiteRT | {same} |")


def contract_header(out):
    """Where `--c-array` puts an LM's device contract: OUT_decode.h."""
    return out.with_name(f"{out.stem}_decode.h")


if __name__ == "__main__":
    sys.exit(main())
