import os
import re
import stat

import numpy as np
import pytest

from tflite_export import atomic_write, c_source, write_c_array


def _parse(source, name="g_model"):
    body = source.split(f"{name}[] = {{", 1)[1].split("};", 1)[0]
    values = bytes(int(v, 16) for v in re.findall(r"0x([0-9a-f]{2})", body))
    length = int(re.search(rf"{name}_len = (\d+);", source).group(1))
    return values, length


def test_c_array_round_trips_the_bytes_with_alignment_and_length(tmp_path):
    model_bytes = np.random.default_rng(0).integers(0, 256, 1001).astype("uint8")
    path = write_c_array(model_bytes.tobytes(), tmp_path / "model.cc")
    source = path.read_text()
    assert "alignas(16) const unsigned char g_model[]" in source
    values, length = _parse(source)
    assert values == model_bytes.tobytes() and length == 1001


def test_custom_array_name():
    values, length = _parse(c_source(b"\x01\x02", name="posenc"), name="posenc")
    assert values == b"\x01\x02" and length == 2


def test_rejects_a_name_that_is_not_a_c_identifier():
    with pytest.raises(ValueError, match="`name` must be a C identifier"):
        c_source(b"\x00", name="2model")


def test_never_overwrites_unless_forced(tmp_path):
    path = tmp_path / "model.cc"
    path.write_text("keep me")
    with pytest.raises(FileExistsError, match="Pass force=True"):
        write_c_array(b"\x00", path)
    assert path.read_text() == "keep me"
    write_c_array(b"\x00", path, force=True)
    assert "0x00" in path.read_text()


def test_a_failed_write_leaves_no_partial_file(tmp_path):
    path = tmp_path / "out.tflite"
    with pytest.raises(TypeError):
        atomic_write(path, 12345)  # not bytes or str: the write fails
    assert list(tmp_path.iterdir()) == []


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        atomic_write(tmp_path / "nope" / "out.tflite", b"\x00")


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_honour_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        path = atomic_write(tmp_path / "model.tflite", b"TFL3")
        existing = tmp_path / "old.cc"
        existing.write_text("x")
        os.chmod(existing, 0o600)
        atomic_write(existing, "new", force=True)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(existing.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
