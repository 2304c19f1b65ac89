#!/usr/bin/env python3
"""Predict digits with a model saved by train.py.

    python predict.py --model_path model.keras                      # held-out digits
    python predict.py --model_path model.keras --images_path my_digits/   # image files
    python predict.py --model_path model.keras --images_path ~/data/mnist # MNIST test set

--images_path may be one image file, a directory of image files (PNG, JPEG,
...; resized to the model's input, dark-on-light drawings are inverted), or
a directory of MNIST files (their test set).  Without it, the held-out part of
scikit-learn's digits.  When labels are known the accuracy is printed too.
Ends with a `summary: {...}` JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cnn_example  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_path", default="model.keras", help="a model saved by train.py")
    parser.add_argument("--images_path", default=None,
                        help="image file, directory of images, or MNIST directory; default: held-out digits")
    parser.add_argument("--show", type=int, default=10,
                        help="print this many individual predictions for a test set (default 10)")
    return parser.parse_args(argv)


def load_inputs(images_path: str | None, height: int, width: int):
    """(names, images, labels or None) for the model's input size."""
    if images_path is None:
        data = cnn_example.load_digits()
        names = [f"digits[{i}]" for i in range(len(data.y_test))]
        return names, cnn_example.resize(data.x_test, height, width), data.y_test
    path = Path(images_path)
    if not path.exists():
        raise cnn_example.DataError(f"--images_path {images_path}: no such file or directory")
    if path.is_dir() and cnn_example.has_mnist(path):
        data = cnn_example.load_mnist(path)
        names = [f"mnist-test[{i}]" for i in range(len(data.y_test))]
        return names, cnn_example.resize(data.x_test, height, width), data.y_test
    names, images = cnn_example.read_images(path, height, width)
    return names, images, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model_path = Path(args.model_path)
    if not model_path.is_file():
        print(f"predict.py: --model_path {args.model_path}: no such model file (train one with train.py)",
              file=sys.stderr)
        return 2
    cnn_example.quiet_tensorflow()
    import keras

    model = keras.models.load_model(model_path)
    _, height, width, _ = model.input_shape
    try:
        names, images, labels = load_inputs(args.images_path, height, width)
    except cnn_example.DataError as exc:
        print(f"predict.py: {exc}", file=sys.stderr)
        return 2
    probabilities = model.predict(images[..., None], verbose=0)
    predicted = probabilities.argmax(axis=1)
    confidence = probabilities.max(axis=1)

    shown = len(names) if labels is None else min(args.show, len(names))
    for i in range(shown):
        truth = "" if labels is None else f" (true {labels[i]})"
        print(f"{names[i]}: {predicted[i]}  p={confidence[i]:.2f}{truth}")
    summary: dict = {"count": len(names), "predictions": predicted[:shown].tolist()}
    if labels is not None:
        accuracy = float(np.mean(predicted == labels))
        summary["accuracy"] = round(accuracy, 4)
        print(f"accuracy {accuracy:.4f} on {len(names)} images")
    print("summary: " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
