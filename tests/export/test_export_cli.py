import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import models
from tflite_export.__main__ import BAD_INPUT, EXPORT_FAILED, main

keras = tf.keras
ROOT_TESTS = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    keras.utils.set_random_seed(0)
    model = models.build_classifier(
        3, vocab_size=10, hidden_dim=8, num_heads=2, num_layers=1, position="t5"
    )
    model.save(folder / "model.keras")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, size=(24, 10)).astype("int32")
    np.savez(folder / "data.npz", x=x, y=rng.integers(0, 3, 24))
    np.savez(folder / "floats.npz", x=x.astype("float32"))
    np.savez(folder / "no_x.npz", inputs=x)
    np.savez(folder / "wide.npz", x=x[:, :, None])
    np.savez(folder / "bad_y.npz", x=x, y=np.zeros((24, 2)))
    return folder


def _args(saved, out, *extra, data="data.npz"):
    return [
        str(saved / "model.keras"),
        "--calibration",
        str(saved / data),
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.slow
def test_success_writes_the_model_and_c_array(saved, tmp_path, capsys):
    out = tmp_path / "model.tflite"
    assert main(_args(saved, out, "--c-array")) == 0
    printed = capsys.readouterr().out
    assert "| TFLM" in printed and "runs" in printed and "accuracy TFLM" in printed
    assert out.read_bytes()[4:8] == b"TFL3"
    assert "alignas(16)" in out.with_suffix(".cc").read_text()
    assert "extern const unsigned char g_model[];" in out.with_suffix(".h").read_text()


@pytest.mark.slow
def test_refuses_to_overwrite_unless_forced(saved, tmp_path, capsys):
    out = tmp_path / "model.tflite"
    out.write_bytes(b"old")
    assert main(_args(saved, out)) == BAD_INPUT
    assert "pass --force" in capsys.readouterr().err
    assert out.read_bytes() == b"old"
    assert main(_args(saved, out, "--force")) == 0
    assert out.read_bytes() != b"old"


@pytest.mark.parametrize(
    "data,match",
    [
        ("missing.npz", "does not exist"),
        ("floats.npz", "must hold integer token ids"),
        ("no_x.npz", "must hold the inputs under `x`"),
        ("wide.npz", "must have shape"),
        ("bad_y.npz", "`y` must be integer labels"),
    ],
)
def test_bad_calibration_data_is_refused_and_writes_nothing(
    saved, tmp_path, capsys, data, match
):
    out = tmp_path / "model.tflite"
    assert main(_args(saved, out, "--c-array", data=data)) == BAD_INPUT
    assert match in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_missing_model_file_is_refused(saved, tmp_path, capsys):
    args = _args(saved, tmp_path / "m.tflite")
    args[0] = str(tmp_path / "nope.keras")
    assert main(args) == BAD_INPUT
    assert "the model file" in capsys.readouterr().err


def test_missing_output_folder_is_refused(saved, tmp_path, capsys):
    assert main(_args(saved, tmp_path / "no" / "m.tflite")) == BAD_INPUT
    assert "output folder" in capsys.readouterr().err


@pytest.mark.slow
def test_a_model_that_cannot_be_quantized_is_refused_and_writes_nothing(
    tmp_path, capsys
):
    inputs = keras.Input((6, 4))
    model = keras.Model(inputs, keras.layers.Dense(4, activation="gelu")(inputs))
    model.save(tmp_path / "gelu.keras")
    np.savez(tmp_path / "data.npz", x=np.zeros((4, 6, 4), "float32"))
    out = tmp_path / "gelu.tflite"
    args = [str(tmp_path / "gelu.keras"), "--calibration", str(tmp_path / "data.npz")]
    assert main(args + ["--out", str(out)]) == EXPORT_FAILED
    assert "GELU" in capsys.readouterr().err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.npz", "gelu.keras"]


@pytest.mark.slow
def test_runs_as_a_module_with_a_nonzero_exit_on_bad_input(saved, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tflite_export",
            *_args(saved, tmp_path / "m.tflite", data="no_x.npz"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert result.returncode == BAD_INPUT
    assert "error:" in result.stderr


def test_refuses_to_write_over_its_own_input(saved, capsys):
    args = _args(saved, saved / "model.keras", "--force")
    before = (saved / "model.keras").read_bytes()
    assert main(args) == BAD_INPUT
    assert "is an input of this export" in capsys.readouterr().err
    assert (saved / "model.keras").read_bytes() == before


def test_refuses_an_out_that_collides_with_the_c_array(saved, tmp_path, capsys):
    assert main(_args(saved, tmp_path / "model.cc", "--c-array")) == BAD_INPUT
    assert "ends in .cc" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_refuses_a_folder_or_an_unwritable_place_before_converting(
    saved, tmp_path, capsys
):
    assert main(_args(saved, tmp_path, "--force")) == BAD_INPUT
    assert "is a folder" in capsys.readouterr().err
    assert main(_args(saved, "/proc/model.tflite")) == BAD_INPUT
    assert "cannot write in the output folder /proc" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_calibration_is_refused_before_converting(tmp_path, capsys, bad):
    inputs = keras.Input((6, 4))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    model.save(tmp_path / "m.keras")
    x = np.zeros((4, 6, 4), "float32")
    x[1, 2, 3] = bad
    np.save(tmp_path / "x.npy", x)
    args = [str(tmp_path / "m.keras"), "--calibration", str(tmp_path / "x.npy")]
    assert main(args + ["--out", str(tmp_path / "m.tflite")]) == BAD_INPUT
    assert "`representative_data` must be finite" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.keras", "x.npy"]


def test_labels_must_match_the_predictions(saved, tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, size=(8, 10)).astype("int32")
    np.savez(tmp_path / "per_token.npz", x=x, y=rng.integers(0, 3, (8, 10)))
    args = _args(saved, tmp_path / "m.tflite")
    args[2] = str(tmp_path / "per_token.npz")
    assert main(args) == BAD_INPUT
    assert "`y` must be integer labels of shape (8,)" in capsys.readouterr().err


def test_no_traceback_reaches_the_user(saved, tmp_path, capsys, monkeypatch):
    import tflite_export

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire\nwith a second line")

    monkeypatch.setattr(tflite_export, "convert", broken)
    assert main(_args(saved, tmp_path / "m.tflite")) == EXPORT_FAILED
    err = capsys.readouterr().err
    assert err.strip() == "error: RuntimeError: disk on fire"
    assert list(tmp_path.iterdir()) == []


def test_a_file_from_the_other_keras_mode_gets_the_hint(
    saved, tmp_path, capsys, monkeypatch
):
    def other_mode(*args, **kwargs):
        raise TypeError("Could not locate class 'Functional'. " + "x" * 11000)

    monkeypatch.setattr(keras.models, "load_model", other_mode)
    assert main(_args(saved, tmp_path / "m.tflite")) == BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "TF_USE_LEGACY_KERAS=1" in err and len(err) < 600


@pytest.fixture(scope="module")
def saved_lm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_lm")
    keras.utils.set_random_seed(0)
    model = models.build_causal_lm(
        11, hidden_dim=8, num_heads=2, num_layers=1, position="alibi"
    )
    model.save(folder / "lm.keras")
    ids = np.random.default_rng(0).integers(1, 11, size=(6, 12)).astype("int32")
    np.save(folder / "ids.npy", ids)
    return folder


@pytest.mark.slow
def test_a_streaming_lm_exports_and_generates_past_its_cache(
    saved_lm, tmp_path, capsys
):
    out = tmp_path / "lm.tflite"
    args = [str(saved_lm / "lm.keras"), "--calibration", str(saved_lm / "ids.npy")]
    args += ["--out", str(out), "--mode", "float32"]
    for bad, message in (
        (["--max-length", "12", "--cache-window", "6"], "exclude each other"),
        (["--sink-tokens", "2"], "--sink-tokens goes with --cache-window"),
    ):
        assert main(args + bad) == BAD_INPUT
        assert message in capsys.readouterr().err and not out.exists()
    assert main(args + ["--cache-window", "6", "--sink-tokens", "2"]) == 0
    printed = capsys.readouterr().out
    from tflite_export import device_contract

    contract = device_contract(out.read_bytes())
    assert contract.streams and contract.cache_length == 8
    assert "t may run past the cache length 8" in printed
    generated = re.search(r"\| litert greedy tokens \| \[([\d, ]*)\]", printed)
    assert len(generated.group(1).split(",")) > 8  # past the 8 slots


@pytest.mark.slow
def test_a_causal_lm_exports_for_microcontrollers(saved_lm, tmp_path, capsys):
    out = tmp_path / "lm.tflite"
    args = [str(saved_lm / "lm.keras"), "--calibration", str(saved_lm / "ids.npy")]
    args += ["--out", str(out), "--target", "tflm", "--max-length", "12", "--c-array"]
    (tmp_path / "lm_decode.h").write_text("mine")
    assert main(args) == BAD_INPUT  # the contract header exists: nothing done
    assert "lm_decode.h exists" in capsys.readouterr().err and not out.exists()
    (tmp_path / "lm_decode.h").unlink()
    code = main(args)
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "| TFLM == LiteRT | True |" in printed
    for row in ("| flash (the .tflite)", "| TFLM arena", "| bits per token, Keras"):
        assert row in printed, row  # the LM report (verify_causal_lm)
    from tflite_export import device_contract

    contract = device_contract(out.read_bytes())
    assert contract.cache_length == 12
    assert contract.table() in printed
    header = (tmp_path / "lm_decode.h").read_text()
    host, part = (
        int(re.search(rf"TFLM arena, {bits}\s*\| (\d+) bytes", printed).group(1))
        for bits in ("64-bit host", "32-bit part")
    )
    assert (host, part) == (contract.arena.bytes, contract.arena.bytes_32bit)
    assert part < host  # both reported, the 32-bit part's smaller
    assert header == contract.c_header("g_model", arena_bytes=contract.arena)
    declarations = (tmp_path / "lm.h").read_text()
    assert f"#define G_MODEL_ARENA_BYTES {host}\n" in declarations
    assert f"#define G_MODEL_ARENA_BYTES_32BIT {part}\n" in declarations
    assert (tmp_path / "lm.cc").exists()


@pytest.mark.slow
def test_name_sets_the_c_symbol_of_every_file(saved_lm, tmp_path, capsys):
    out = tmp_path / "lm.tflite"
    args = [str(saved_lm / "lm.keras"), "--calibration", str(saved_lm / "ids.npy")]
    args += ["--out", str(out), "--target", "tflm", "--max-length", "12"]
    assert main(args + ["--c-array", "--name", "int"]) == BAD_INPUT
    assert "C or C++ keyword" in capsys.readouterr().err
    assert main(args + ["--c-array", "--target", "litert"]) == BAD_INPUT
    assert "pass --target tflm" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main(args + ["--c-array", "--name", "tiny_lm"]) == 0
    capsys.readouterr()
    assert "tiny_lm[] = {" in (tmp_path / "lm.cc").read_text()
    assert "#define TINY_LM_OPS(X)" in (tmp_path / "lm.h").read_text()
    assert "TINY_LM_ARENA_BYTES" in (tmp_path / "lm_decode.h").read_text()


@pytest.mark.slow
def test_a_byte_level_lms_sample_is_printed_as_text(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    model = models.build_causal_lm(256, hidden_dim=8, num_heads=2, num_layers=1)
    model.save(tmp_path / "bytes.keras")
    ids = np.frombuffer(b"the cat sat on the mat. " * 2, np.uint8).astype("int32")
    np.save(tmp_path / "ids.npy", ids.reshape(4, 12))
    args = [str(tmp_path / "bytes.keras"), "--calibration", str(tmp_path / "ids.npy")]
    assert main(args + ["--out", str(tmp_path / "b.tflite"), "--max-length", "12"]) == 0
    printed = capsys.readouterr().out
    found = re.search(r"\| litert greedy tokens \| \[([\d, ]*)\] \|", printed)
    ids = [int(v) for v in found.group(1).split(",")]
    text = bytes(ids).decode("utf-8", errors="replace")
    assert f"| litert greedy text | {text!r} |" in printed


def test_an_out_that_is_a_folder_is_refused(saved, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out in (".", str(tmp_path)):
        assert main(_args(saved, out, "--c-array")) == BAD_INPUT
        assert "is a folder; name a file" in capsys.readouterr().err


def test_every_flag_explains_itself(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--calibration", "--out", "--sequence-length", "--name", "--mode"):
        assert re.search(rf"{flag}[^\n]*\n?\s+\S", text), flag
    assert "`x`" in text and "`y`" in text and ".npy" in text


def test_causal_lm_options_are_refused_for_other_models(saved, tmp_path, capsys):
    assert main(_args(saved, tmp_path / "m.tflite", "--target", "tflm")) == BAD_INPUT
    assert "causal language models" in capsys.readouterr().err
    assert not (tmp_path / "m.tflite").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_sigterm_during_verification_leaves_nothing_behind(saved, tmp_path):
    from test_export_verify import _alive, _children

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    command = [sys.executable, "-m", "tflite_export"]
    command += _args(saved, out_dir / "m.tflite", "--c-array")
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers, deadline = [], time.time() + 240
    while not workers and time.time() < deadline and cli.poll() is None:
        time.sleep(0.1)
        # The TFLM worker itself (exec'd: its own command line): the CLI's
        # other children (e.g. a library's ldconfig while TensorFlow is
        # imported, before the CLI's handler is installed) are not it.
        workers = _children(cli.pid, "tflite_export._tflm.worker")
    assert workers, "the export ended before its TFLM verification could be seen"
    # Frozen, the worker cannot finish before the signal lands, however
    # loaded the machine: the CLI is certainly waiting on it.
    for worker in workers:
        os.kill(worker, signal.SIGSTOP)
    cli.terminate()
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 128 + 15
    assert "interrupted" in err.decode() and "Traceback" not in err.decode()
    assert list(out_dir.iterdir()) == []
    time.sleep(1)
    assert not any(map(_alive, workers))


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_a_max_length_below_one_is_refused(saved, tmp_path, capsys, value):
    out = tmp_path / "lm.tflite"
    with pytest.raises(SystemExit) as exit_info:
        main(_args(saved, out, "--max-length", value))
    assert exit_info.value.code == BAD_INPUT
    assert "--max-length" in capsys.readouterr().err and not out.exists()


def test_a_real_file_of_the_other_keras_mode_gets_the_hint(saved, tmp_path, capsys):
    import keras_posenc

    other = "keras2" if keras_posenc.IS_KERAS_3 else "keras3"
    model = ROOT_TESTS / "fixtures" / other / "t5.keras"
    args = _args(saved, tmp_path / "m.tflite")
    args[0] = str(model)
    assert main(args) == BAD_INPUT
    err = capsys.readouterr().err
    assert "TF_USE_LEGACY_KERAS=1" in err and "saved by Keras" in err
    assert not (tmp_path / "m.tflite").exists()
