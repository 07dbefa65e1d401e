"""`python -m benchmarks [--quick] [--only NAME ...]` (names: `BENCHMARKS`)."""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse
import time
from types import SimpleNamespace

from benchmarks import (
    accuracy,
    backends,
    content,
    decoders,
    edge,
    fire,
    generate,
    litert_torch,
    litertlm,
    lm,
    lm_edge,
    lm_memory,
    local,
    memory,
    packed,
    profile,
    qat,
    rope,
    scaling,
    sparse,
    speed,
    stream_step,
    streaming,
)

BENCHMARKS = {
    "speed": speed,
    "speed_steps": SimpleNamespace(run=speed.run_steps),  # one of speed's tables
    "speed_peers": SimpleNamespace(run=speed.run_peers),  # another
    "profile": profile,
    "scaling": scaling,
    "local": local,
    "sparse": sparse,
    "memory": memory,
    "edge": edge,
    "accuracy": accuracy,
    "content": content,
    "rope": rope,
    "lm": lm,
    "lm_content": SimpleNamespace(run=lm.run_content),
    "fire": fire,
    "lm_edge": lm_edge,
    "lm_memory": lm_memory,
    "generate": generate,
    "litertlm": litertlm,
    "streaming": streaming,
    "stream_step": stream_step,
    "packed": packed,
    "qat": qat,  # both parts; each alone:
    "qat_digits": SimpleNamespace(run=qat.run_digits),
    "qat_lm": SimpleNamespace(run=qat.run_lm),
    "qat_generators": SimpleNamespace(run=qat.run_generators),
    "qat_fidelity": SimpleNamespace(run=qat.run_fidelity),
    "backends": backends,  # a child process per Keras 3 backend
    "litert_torch": litert_torch,  # a PyTorch child converts, this one compares
    "decoders": decoders,  # a child process per Keras 3 backend
}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--only", nargs="*", choices=list(BENCHMARKS), default=None)
    args = parser.parse_args(argv)
    for name in args.only or list(BENCHMARKS):
        start = time.time()
        BENCHMARKS[name].run(args.quick)
        print(f"[{name}: {time.time() - start:.0f} s]\n")


if __name__ == "__main__":
    main()
