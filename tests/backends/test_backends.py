"""Every builder method, attention path, rotary scaling and causal LM on the
backend this pass runs on (`KERAS_BACKEND`: tensorflow, jax or torch), and
the `.keras` files the other backends save.

Each pass loads the files every other installed backend writes
(`reference.py`, in a subprocess) and gives their results from the same
weights: outputs and scores to 1e-5, the same greedy tokens, with and
without a rolling cache. Together the three passes cover every pair of
backends. The tests here use `keras.ops` and NumPy only.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

import keras
import numpy as np
import pytest
from cases import TOKENS, VOCAB, all_cases, lm_cases, results

from keras_posenc import IS_KERAS_3, layers, models
from keras_posenc._backend import BACKEND
from keras_posenc.generation import Sampling
from keras_posenc.layers import ActivationRange
from keras_posenc.models.capabilities import capabilities
from keras_posenc.utils import nested_layers, require_tensorflow

pytestmark = pytest.mark.skipif(
    not IS_KERAS_3, reason="Keras 2 (TF_USE_LEGACY_KERAS=1) has one backend"
)

HERE = os.path.dirname(os.path.abspath(__file__))
#: The package each backend needs; a backend missing here is skipped by name.
PACKAGES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
OTHERS = [b for b in PACKAGES if b != BACKEND]
CASES = sorted(all_cases())
LM_METHODS = [m for m in models.METHODS]


def _installed(backend):
    return importlib.util.find_spec(PACKAGES[backend]) is not None


#: A directory where the passes of one `make test` share what each backend
#: saved (unset: each pass saves its own). Files are kept under a digest of
#: the package's and these tests' sources and the Keras version, so a pass
#: reads only what the same code wrote.
SHARED = os.environ.get("KERAS_POSENC_BACKEND_FILES")


def _digest(backend):
    import hashlib

    digest = hashlib.sha256(f"{backend} {keras.__version__}".encode())
    root = os.path.dirname(os.path.dirname(HERE))
    for folder in ("keras_posenc", os.path.join("tests", "backends")):
        for directory, _, names in sorted(os.walk(os.path.join(root, folder))):
            for name in sorted(n for n in names if n.endswith(".py")):
                with open(os.path.join(directory, name), "rb") as file:
                    digest.update(name.encode() + file.read())
    return digest.hexdigest()[:16]


def _save_on(backend, path):
    """Runs `reference.py` on `backend` into `path`: None, or its stderr."""
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.pop("TF_USE_LEGACY_KERAS", None)
    script = os.path.join(HERE, "reference.py")
    run = subprocess.run(
        [sys.executable, script, str(path)], env=env, capture_output=True, text=True
    )
    return None if run.returncode == 0 else run.stderr


@pytest.fixture(scope="session")
def saved_on(tmp_path_factory):
    """`saved_on(backend)`: the directory of every case saved on `backend`."""
    made = {}

    def directory(backend):
        if not _installed(backend):
            pytest.skip(f"needs {PACKAGES[backend]} (pip install -e '.[backends]')")
        if backend not in made:
            shared = SHARED and os.path.join(SHARED, f"{backend}-{_digest(backend)}")
            if shared and os.path.isdir(shared):
                made[backend] = shared  # saved by an earlier pass of this code
            elif shared:  # saved beside `shared`, then renamed: all of it or none
                os.makedirs(SHARED, exist_ok=True)
                path = tempfile.mkdtemp(dir=SHARED)
                failed = _save_on(backend, path)
                if not failed:
                    try:
                        os.rename(path, shared)
                    except OSError:  # another pass saved it first: theirs
                        shutil.rmtree(path)
                made[backend] = failed or shared
            else:
                path = str(tmp_path_factory.mktemp(f"saved-on-{backend}"))
                made[backend] = _save_on(backend, path) or path
        if not os.path.isdir(made[backend]):
            pytest.fail(f"reference.py on {backend} failed:\n{made[backend][-3000:]}")
        return made[backend]

    return directory


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_keras_files_saved_on_the_other_backends_give_their_results(saved_on, case):
    """Each other backend's file loads with the weights it saved (the
    same on every backend: `cases.shared_weights`), and gives the results
    that backend wrote: outputs and scores to 1e-5, the same tokens."""
    loaded = {}
    for source in OTHERS:
        path = os.path.join(saved_on(source), case)
        loaded[source] = (
            keras.models.load_model(f"{path}.keras"),
            np.load(f"{path}.npz"),
        )
    first, _ = loaded[OTHERS[0]]
    got = results(case, first)  # what this backend gives from those weights
    for source, (model, want) in loaded.items():
        for mine, theirs in zip(first.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(mine, theirs)
        assert sorted(got) == sorted(want.files), source
        for key in ("outputs", "scores"):
            if key in got:
                np.testing.assert_allclose(got[key], want[key], atol=1e-5, rtol=0)
        for key in ("tokens", "streamed"):
            if key in got:
                np.testing.assert_array_equal(got[key], want[key], err_msg=source)


#: The rounding layers: TensorFlow's alone (QAT), refused elsewhere by name.
ROUNDING = {"ActivationRange", "QuantizedAdd", "QuantizedDense"}


def test_the_cases_meet_every_public_layer():
    met = set()
    for build in all_cases().values():
        keras.utils.set_random_seed(0)
        met |= {type(layer).__name__ for layer in nested_layers(build())}
    public = {name for name in layers.__all__ if name[0].isupper()}
    assert public - ROUNDING - met == set()


def _periodic(rows, length, rng):
    """Rows counting 1, 2, ..., 7, 1, 2, ... from a random start: every next
    token is known from the one before."""
    starts = rng.integers(0, 7, size=(rows, 1))
    return ((starts + np.arange(length)) % 7 + 1).astype("int32")


@pytest.mark.slow
@pytest.mark.parametrize("method", LM_METHODS)
def test_each_methods_lm_trains_and_generates_on_this_backend(method):
    """`fit` lowers the loss of a task with an answer; the compiled loop
    gives the step loop's tokens and the recompute's."""
    assert capabilities(method).backends[BACKEND]  # the table's claim, held
    keras.utils.set_random_seed(0)
    data = _periodic(64, 12, np.random.default_rng(1))
    lm = models.build_causal_lm(
        VOCAB, hidden_dim=16, num_heads=2, num_layers=2, position=method
    )
    lm.compile(
        keras.optimizers.Adam(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    losses = lm.fit(data[:, :-1], data[:, 1:], epochs=4, verbose=0).history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    prompts = [[1, 2, 3], [5, 6, 7, 1]]
    tokens = lm.generate(prompts, 5)
    np.testing.assert_array_equal(tokens, lm.generate(prompts, 5, compiled_loop=False))
    np.testing.assert_array_equal(
        tokens, lm.generate(prompts, 5, compiled_loop=False, use_cache=False)
    )


def test_scores_are_the_log_softmax_of_the_logits():
    keras.utils.set_random_seed(0)
    lm = lm_cases()["lm-rope"]()
    logits = keras.ops.convert_to_numpy(lm(TOKENS)).astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    rows, steps = np.indices(TOKENS[:, 1:].shape)
    want = log_probs[rows, steps, TOKENS[:, 1:]]
    np.testing.assert_allclose(lm.score(TOKENS), want, atol=1e-5)


def test_the_compiled_loop_is_traced_once_where_the_backend_compiles():
    """On TensorFlow and JAX a second `generate` runs the compiled loop
    without calling the model's Python again; PyTorch runs it eagerly."""
    keras.utils.set_random_seed(0)
    lm = lm_cases()["lm-t5"]()
    calls = []
    original = lm.call_with_cache

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    lm.call_with_cache = counted
    first = lm.generate([[1, 2, 3]], 4)
    traced = len(calls)
    second = lm.generate([[1, 2, 3]], 4)
    np.testing.assert_array_equal(first, second)
    if BACKEND == "torch":
        assert len(calls) > traced  # eager: the Python runs at every step
    else:
        assert len(calls) == traced


def test_a_trained_model_decodes_with_its_new_weights():
    """The compiled loop reads the weights at each call (JAX passes them in)."""
    keras.utils.set_random_seed(0)
    lm = lm_cases()["lm-alibi"]()
    sampling = Sampling()
    before = lm.generate([[1, 2, 3]], 6, sampling=sampling)
    for variable in lm.trainable_variables:
        variable.assign(variable * 0.0)
    after = lm.generate([[1, 2, 3]], 6, sampling=sampling)
    # Zero weights give equal logits: greedy takes token 0 every step.
    np.testing.assert_array_equal(after[0, 3:], np.zeros(6, np.int32))
    assert not np.array_equal(before, after)


def test_qat_runs_on_tensorflow_and_is_refused_by_name_elsewhere():
    if BACKEND == "tensorflow":  # the QAT tests of tests/training run it
        assert models.build_causal_lm(VOCAB, hidden_dim=16, num_heads=2, quantize=True)
        assert ActivationRange()
        return
    with pytest.raises(ValueError, match=f"`quantize` must be False on the {BACKEND}"):
        models.build_causal_lm(VOCAB, hidden_dim=16, num_heads=2, quantize=True)
    with pytest.raises(ValueError, match="`ActivationRange` needs KERAS_BACKEND"):
        ActivationRange()


def test_exports_run_on_tensorflow_and_are_refused_by_name_elsewhere():
    import tflite_export

    keras.utils.set_random_seed(0)
    lm = lm_cases()["lm-t5"]()
    if BACKEND == "tensorflow":  # tests/export runs every export
        assert require_tensorflow("convert_causal_lm") is None
        return
    with pytest.raises(RuntimeError, match="`convert_causal_lm` runs with KERAS_"):
        tflite_export.convert_causal_lm(lm, TOKENS)
