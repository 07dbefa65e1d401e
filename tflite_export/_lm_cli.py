"""The command line's causal-LM export (`python -m tflite_export` on a CausalLM)."""

import sys


def export_causal_lm(args, model, x):
    """Converts a causal LM, checks generation on the device, then writes it."""
    import tflite_export
    from tflite_export.__main__ import EXPORT_FAILED, write_outputs
    from tflite_export.causal_lm import check_calibration_ids

    if args.mode not in ("int8", "float32"):
        raise ValueError(
            f"--mode must be int8 or float32 for a causal LM, not {args.mode}"
        )
    length = args.max_length or 64
    ids = check_calibration_ids(model, x)
    target = args.target or "litert"
    try:
        model_bytes = tflite_export.convert_causal_lm(
            model, ids, args.mode, length, target
        )
    except tflite_export.ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXPORT_FAILED
    prompt = [ids[0, : max(1, min(ids.shape[1], length // 2))].tolist()]
    new = length - len(prompt[0])
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
    print(f"| signatures | {'decode' if target == 'tflm' else 'prefill, decode'} |")
    print(f"| size | {len(model_bytes)} bytes |")
    for runtime, found in tokens.items():
        print(f"| {runtime} greedy tokens | {found[0, len(prompt[0]) :].tolist()} |")
    if len(tokens) == 2:
        same = bool((tokens["litert"] == tokens["tflm"]).all())
        print(f"| TFLM == LiteRT | {same} |")
    return write_outputs(args, model_bytes)
