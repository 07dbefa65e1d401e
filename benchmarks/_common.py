"""Shared benchmark plumbing: timing, peak memory in a subprocess, result files."""

import json
import pathlib
import platform
import resource
import subprocess
import sys
import time

import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def machine():
    """One line naming the machine and the versions measured."""
    import tensorflow as tf

    import keras_posenc

    cpus = len(__import__("os").sched_getaffinity(0))
    keras_name = "Keras 3" if keras_posenc.IS_KERAS_3 else "Keras 2 (tf_keras)"
    return (
        f"{platform.machine()}, {cpus} cores, Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, {keras_name}"
    )


def fwd_bwd(layer, x, xla=False, sparse=False):
    """A compiled forward+backward step of `layer(x, x)` (graph, or XLA).

    The step returns the loss with the gradients, so no part of the forward
    pass is pruned as unused by the backward (a linear layer's gradient does
    not read its own output). The gradients are dense tensors, as Keras'
    Adam reads them: a gather's gradient (keras-hub's T5 bias table) is
    otherwise a sparse `IndexedSlices` of one row per gathered element that
    nothing has summed yet; `sparse=True` leaves it so.
    """
    import tensorflow as tf

    @tf.function(jit_compile=xla)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, x))
        grads = tape.gradient(loss, layer.trainable_variables)
        if not sparse:
            grads = [tf.convert_to_tensor(grad) for grad in grads]
        return loss, grads

    return step


def mean_seconds(fn, calls):
    """Wall time of `fn()` per call, over `calls` calls in a row."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def median_seconds(fn, repeats=5, warmup=2):
    """Median wall time of `fn()` after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def peak_rss_mb(module, *args, timeout=900):
    """Runs `python -m module args` alone and returns its JSON and peak RSS (MB).

    A fresh process per measurement, so one measurement's peak cannot hide
    another's.
    """
    result = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def own_peak_rss_mb():
    """This process's peak resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def summary(values):
    """`mean ±half-range` over seeds (the value alone for one seed)."""
    values = np.asarray(values)
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{values.mean():.3f} ±{(values.max() - values.min()) / 2:.3f}"


def interleaved(runs, rounds):
    """`{name: [seconds]}` of each of `runs` (`{name: call}`) over `rounds`
    rounds, each round calling every one in turn."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def write(name, title, header, rows, notes=(), figure=None):
    """Writes `results/NAME.md` (and `NAME.png`) and prints the table."""
    RESULTS.mkdir(exist_ok=True)
    lines = [f"# {title}", "", f"Machine: {machine()}", ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + " --- |" * len(header))
    lines.extend("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)
    lines.extend([""] + [f"- {note}" for note in notes])
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{name}.md").write_text(text)
    if figure is not None:
        figure.savefig(RESULTS / f"{name}.png")
    print(text)
    return text


def per_backend(module, quick, backends=("tensorflow", "jax", "torch")):
    """`module`'s child run on each installed Keras 3 backend: the JSON row
    dicts each child printed last, merged key by key (`python -m module
    BACKEND [--quick]`, one process per backend)."""
    import importlib.util
    import os

    merged = {}
    for backend in backends:
        if importlib.util.find_spec(backend) is None:
            print(f"{module}: {backend} skipped, it needs {backend} ('.[backends]')")
            continue
        env = dict(os.environ, KERAS_BACKEND=backend)
        env.pop("TF_USE_LEGACY_KERAS", None)
        command = [sys.executable, "-m", module, backend]
        done = subprocess.run(
            command + (["--quick"] if quick else []),
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the {backend} child failed:\n{done.stderr[-3000:]}")
        for key, rows in json.loads(done.stdout.strip().splitlines()[-1]).items():
            merged.setdefault(key, []).extend(rows)
    return merged
