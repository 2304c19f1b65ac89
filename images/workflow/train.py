#!/usr/bin/env python3
"""Train the example CNN and save it.

    python train.py --epochs 5 --model_path model.keras
    python train.py --epochs 5 --model_path model.keras --images_path ~/data/mnist

Without --images_path it trains on scikit-learn's bundled 8x8 digits (works
offline); with it, on the MNIST files in that directory.  Prints one line per
epoch with its time, then a `summary: {...}` JSON line.  --device cpu hides
the GPUs, to compare a GPU run against a CPU run of the same model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cnn_example  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training data (default 5)")
    parser.add_argument("--model_path", default="model.keras", help="where to save the model (.keras)")
    parser.add_argument("--images_path", default=None,
                        help="directory with MNIST files; default: scikit-learn's bundled digits")
    parser.add_argument("--batch_size", type=int, default=32, help="images per step (default 32)")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                        help="cpu: hide GPUs; gpu: fail unless TensorFlow sees one (default auto)")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    if args.batch_size < 1:
        parser.error("--batch_size must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        model_path = cnn_example.check_model_path(args.model_path)
        data = cnn_example.load_dataset(args.images_path)
    except cnn_example.DataError as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        # Must happen before TensorFlow initialises CUDA.
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    cnn_example.quiet_tensorflow()
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if args.device == "gpu" and not gpus:
        print("train.py: --device gpu, but TensorFlow sees no GPU "
              f"(built with CUDA: {tf.test.is_built_with_cuda()})", file=sys.stderr)
        return 3
    device = f"GPU x{len(gpus)}" if gpus else "CPU"
    onednn = cnn_example.onednn_enabled()
    print(f"TensorFlow {tf.__version__} on {device} (oneDNN {'on' if onednn else 'off'}); data: {data.source} "
          f"({len(data.y_train)} train / {len(data.y_test)} test, {data.x_train.shape[1]}x{data.x_train.shape[2]})",
          flush=True)

    epoch_seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.start
            epoch_seconds.append(seconds)
            print(f"epoch {epoch + 1}/{args.epochs}: {seconds:.2f} s, loss {logs['loss']:.4f}, "
                  f"accuracy {logs['accuracy']:.4f}", flush=True)

    keras.utils.set_random_seed(0)
    height, width = data.x_train.shape[1:3]
    model = cnn_example.build_model(height, width)
    model.fit(data.x_train[..., None], data.y_train, epochs=args.epochs, batch_size=args.batch_size,
              verbose=0, callbacks=[EpochTimer()])
    loss, accuracy = model.evaluate(data.x_test[..., None], data.y_test, verbose=0)

    # Save next to the target and rename, so a failed save leaves no half-written model.
    model_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = model_path.with_name(f".{model_path.stem}.tmp{os.getpid()}{model_path.suffix}")
    try:
        model.save(tmp)
        os.replace(tmp, model_path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"test accuracy {accuracy:.4f}; model saved to {model_path}")
    print("summary: " + json.dumps({
        "tensorflow": tf.__version__, "device": device, "onednn": onednn, "source": data.source,
        "epochs": args.epochs, "epoch_seconds": [round(s, 4) for s in epoch_seconds],
        "test_accuracy": round(float(accuracy), 4), "test_loss": round(float(loss), 4),
        "model_path": str(model_path),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
