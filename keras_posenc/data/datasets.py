"""Real data that ships with installed packages (no download)."""

import numpy as np


def digits_patches(seed=0):
    """sklearn's 8x8 digits as 16 tokens of 2x2 pixel patches, shuffled.

    Returns:
        `(x, y)`: float32 patches `(1797, 16, 4)` in `[0, 1]`, row-major over
        the 4x4 patch grid, and int labels `(1797,)`.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "digits_patches needs scikit-learn: pip install 'keras_posenc[examples]'"
        ) from error
    digits = load_digits()
    images = digits.images.astype("float32") / 16.0  # (N, 8, 8)
    patches = images.reshape(-1, 4, 2, 4, 2).transpose(0, 1, 3, 2, 4)
    order = np.random.default_rng(seed).permutation(len(images))
    return patches.reshape(-1, 16, 4)[order], digits.target[order]
