"""A worker that outlives any test: used to prove workers die with their parent."""

import time

from tflite_export._tflm.child import serve

if __name__ == "__main__":
    serve(lambda arrays: time.sleep(300) or {})
