"""The example workflow's shared parts: data that works offline, and the CNN.

Data comes from one of two places:

* MNIST files, when a directory holds them: the classic IDX files
  (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
  t10k-labels-idx1-ubyte, each optionally .gz) or Keras's mnist.npz.
* Otherwise scikit-learn's 8x8 digits, which ship inside the scikit-learn
  wheel: no download, so it works on hosts without internet access.

TensorFlow is imported lazily (inside functions) so `--help` and input errors
answer at once instead of after TensorFlow's few seconds of start-up.
"""

from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".pgm", ".tif", ".tiff"}


class DataError(ValueError):
    """The data given cannot be used; the message says why and what to give instead."""


@dataclass
class Dataset:
    source: str                # "digits" or "mnist:<dir>"
    x_train: np.ndarray        # (n, h, w) float32 in [0, 1]
    y_train: np.ndarray        # (n,) int
    x_test: np.ndarray
    y_test: np.ndarray


def _find(directory: Path, stem: str) -> Path | None:
    # MNIST mirrors name the files with a dot or a dash before "idx"; accept both.
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0:2] != b"\x00\x00" or data[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file (MNIST format)")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise DataError(f"{path} is truncated: header says {shape}, found {array.size} bytes")
    return array.reshape(shape)


def has_mnist(directory: Path) -> bool:
    return (directory / "mnist.npz").is_file() or all(_find(directory, s) for s in MNIST_FILES.values())


def load_mnist(directory: Path) -> Dataset:
    if (directory / "mnist.npz").is_file():
        with np.load(directory / "mnist.npz") as npz:
            parts = {k: npz[k] for k in MNIST_FILES}
    else:
        paths = {key: _find(directory, stem) for key, stem in MNIST_FILES.items()}
        missing = [MNIST_FILES[k] for k, p in paths.items() if p is None]
        if missing:
            raise DataError(f"{directory} lacks MNIST files: {', '.join(missing)} (optionally .gz)")
        parts = {key: _read_idx(path) for key, path in paths.items()}
    return Dataset(
        source=f"mnist:{directory}",
        x_train=parts["x_train"].astype("float32") / 255.0,
        y_train=parts["y_train"].astype("int64"),
        x_test=parts["x_test"].astype("float32") / 255.0,
        y_test=parts["y_test"].astype("int64"),
    )


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    from sklearn.datasets import load_digits as sk_digits

    digits = sk_digits()
    images = digits.images.astype("float32") / 16.0   # the digits' pixels run 0..16
    labels = digits.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return Dataset("digits", images[train], labels[train], images[test], labels[test])


def load_dataset(images_path: str | None) -> Dataset:
    """MNIST from `images_path` when given, else the bundled digits."""
    if not images_path:
        return load_digits()
    directory = Path(images_path)
    if not directory.is_dir():
        raise DataError(f"--images_path {images_path}: no such directory")
    if not has_mnist(directory):
        raise DataError(
            f"--images_path {images_path}: no MNIST files there (expected mnist.npz or "
            f"{', '.join(MNIST_FILES.values())}, optionally .gz); leave it out to train on "
            "scikit-learn's bundled digits")
    return load_mnist(directory)


def build_model(height: int, width: int, classes: int = 10):
    """A small CNN that fits both 8x8 digits and 28x28 MNIST."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input(shape=(height, width, 1)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dropout(0.25),
        layers.Dense(128, activation="relu"),
        layers.Dense(classes, activation="softmax"),
    ], name="digits_cnn")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def check_model_path(path: str) -> Path:
    # Keras 3 saves only to .keras (or legacy .h5) files; say so before training, not after.
    p = Path(path)
    if p.suffix not in (".keras", ".h5"):
        raise DataError(f"--model_path {path}: must end in .keras (Keras 3 format), e.g. model.keras")
    if p.is_dir():
        raise DataError(f"--model_path {path} is a directory; give a file name ending in .keras")
    return p


def read_images(path: Path, height: int, width: int) -> tuple[list[str], np.ndarray]:
    """Image files (one file or a directory of them) as a (n, h, w) array in [0, 1],
    resized to the model's input and, when drawn dark on light, inverted to
    MNIST's light-on-dark."""
    from PIL import Image

    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise DataError(f"--images_path {path}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    arrays = []
    for f in files:
        try:
            with Image.open(f) as img:
                gray = img.convert("L").resize((width, height), Image.Resampling.LANCZOS)
        except OSError as exc:
            raise DataError(f"{f}: not a readable image ({exc})") from None
        a = np.asarray(gray, dtype="float32") / 255.0
        arrays.append(1.0 - a if a.mean() > 0.5 else a)
    return [f.name for f in files], np.stack(arrays)


def resize(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize a (n, h, w) batch to the model's input size (e.g. digits for an MNIST model)."""
    if images.shape[1:3] == (height, width):
        return images
    import tensorflow as tf

    return tf.image.resize(images[..., None], (height, width)).numpy()[..., 0]


def onednn_enabled() -> bool | None:
    """Whether TensorFlow runs its oneDNN (MKL) kernels: on by default on x86_64
    Linux, off with TF_ENABLE_ONEDNN_OPTS=0.  None if this TensorFlow cannot say."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def quiet_tensorflow() -> None:
    # Keep TensorFlow's C++ INFO lines out of the script's output unless asked for.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
