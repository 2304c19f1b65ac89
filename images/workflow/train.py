#!/usr/bin/env python3
"""Train the example CNN and save it.

    python train.py --epochs 5 --model_path model.keras
    python train.py --epochs 5 --model_path model.keras --images_path ~/data/mnist

Without --images_path it trains on scikit-learn's bundled 8x8 digits (works
offline); with it, on the MNIST files in that directory.  Prints one line per
epoch with its time, then a `summary: {...}` JSON line.  --device cpu hides
the GPUs, to compare a GPU run against a CPU run of the same model.

It survives being stopped: each epoch ends with a backup of the training
(tf.keras.callbacks.BackupAndRestore) in a directory of your home, and a run
that finds one resumes at the epoch after it, so a job whose borrowed GPUs are
reclaimed and queued again, or a training you interrupt, loses at most the
epoch it was in.  The directory is --backup_dir, by default
$GPUHUB_CHECKPOINT_DIR/train-<model name> in a job (gpu-job sets it, one per
job) and ~/.gpuhub/checkpoints/train-<model name> elsewhere; a training that
ends removes its backup.  SIGTERM (a reclaim's notice) stops it at the end of
the batch it is in, keeping the last epoch's backup.

--strategy multiworker trains data-parallel over the workers of a cluster job
(`gpu-job submit --workers 2 ... -- python train.py --strategy multiworker`):
tf.distribute.MultiWorkerMirroredStrategy reads the cluster from TF_CONFIG,
each worker trains on its share of every batch, and only the chief (worker 0)
writes the model to --model_path.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
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
    parser.add_argument("--strategy", choices=["single", "multiworker"], default="single",
                        help="multiworker: MultiWorkerMirroredStrategy over TF_CONFIG's workers, "
                             "--batch_size images per worker (default single)")
    parser.add_argument("--backup_dir", default=None,
                        help="where each epoch's backup goes, to resume from after an interruption "
                             "(default: $GPUHUB_CHECKPOINT_DIR/train-<model name> in a job, else "
                             "~/.gpuhub/checkpoints/train-<model name>); '' for none")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    if args.batch_size < 1:
        parser.error("--batch_size must be at least 1")
    return args


def backup_dir(args: argparse.Namespace, model_path: Path) -> Path | None:
    """The directory of this training's backup (None: no backup).  One per model name, as
    BackupAndRestore wants a directory of its own (it removes it when the training ends)."""
    if args.backup_dir is not None:
        return Path(args.backup_dir).expanduser() if args.backup_dir else None
    base = os.environ.get("GPUHUB_CHECKPOINT_DIR") or str(Path.home() / ".gpuhub" / "checkpoints")
    return Path(base).expanduser() / f"train-{model_path.stem}"


def backed_up_epochs(directory: Path) -> int:
    """How many epochs the backup in `directory` holds (0: none), from BackupAndRestore's metadata."""
    try:
        return int(json.loads((directory / "training_metadata.json").read_text())["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class Notice:
    """SIGTERM, as a reclaim's notice or `docker stop` sends it: noted here, acted on at the end
    of the batch being trained (never in the middle of writing a backup)."""

    def __init__(self):
        self.received = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum, frame) -> None:
        self.received = True


def cluster_task() -> tuple[int, int]:
    """(workers, this worker's index) from TF_CONFIG, as a cluster job sets it; ValueError if unusable."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError("--strategy multiworker needs TF_CONFIG (a cluster job sets it: "
                         "gpu-job submit --workers 2 ...)")
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        index = int(config["task"]["index"])
    except (ValueError, KeyError, TypeError):
        raise ValueError("TF_CONFIG is not of the form {\"cluster\": {\"worker\": [...]}, "
                         "\"task\": {\"type\": \"worker\", \"index\": i}}") from None
    if not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG's task index {index} is not one of its {len(workers)} workers")
    return len(workers), index


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workers, task = 1, 0
    if args.strategy == "multiworker":
        try:
            workers, task = cluster_task()
        except ValueError as exc:
            print(f"train.py: {exc}", file=sys.stderr)
            return 2
    chief = task == 0
    notice = Notice()
    if args.strategy == "single":
        notice.install()  # (a cluster's workers stop on SIGTERM as they always did: no backup there)
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

    # Made before anything else touches TensorFlow's runtime: it sets up the collective ops.
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if args.strategy == "multiworker" else None
    gpus = tf.config.list_physical_devices("GPU")
    if args.device == "gpu" and not gpus:
        print("train.py: --device gpu, but TensorFlow sees no GPU "
              f"(built with CUDA: {tf.test.is_built_with_cuda()})", file=sys.stderr)
        return 3
    device = f"GPU x{len(gpus)}" if gpus else "CPU"
    onednn = cnn_example.onednn_enabled()
    role = f"; worker {task} of {workers}{' (chief)' if chief else ''}" if strategy is not None else ""
    print(f"TensorFlow {tf.__version__} on {device} (oneDNN {'on' if onednn else 'off'}); data: {data.source} "
          f"({len(data.y_train)} train / {len(data.y_test)} test, {data.x_train.shape[1]}x{data.x_train.shape[2]})"
          f"{role}", flush=True)

    epoch_seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.start
            epoch_seconds.append(seconds)
            print(f"epoch {epoch + 1}/{args.epochs}: {seconds:.2f} s, loss {logs['loss']:.4f}, "
                  f"accuracy {logs['accuracy']:.4f}", flush=True)

    class StopOnNotice(keras.callbacks.Callback):
        """After BackupAndRestore in the list: SIGTERM ends the run at the next batch's end,
        with the last finished epoch's backup left for the next run."""

        def on_train_batch_end(self, batch, logs=None):
            if notice.received:
                done = backed_up_epochs(backup) if backup else 0
                print(f"train.py: SIGTERM: stopping after {done} of {args.epochs} epochs"
                      + (f"; the next run resumes at epoch {done + 1} from {backup}" if backup else ""),
                      flush=True)
                raise SystemExit(143)  # skips fit's end, which would remove the backup

    backup, resumed = None, 0
    keras.utils.set_random_seed(0)
    height, width = data.x_train.shape[1:3]
    if strategy is None:
        model = cnn_example.build_model(height, width)
        backup = backup_dir(args, model_path)
        callbacks = [EpochTimer()]
        if backup is not None:
            resumed = done = backed_up_epochs(backup)
            if done:
                print(f"resuming from the backup in {backup}: {done} of {args.epochs} epochs done, "
                      + (f"starting at epoch {done + 1}" if done < args.epochs else "none left to train"),
                      flush=True)
            callbacks.insert(0, keras.callbacks.BackupAndRestore(str(backup)))
        callbacks.append(StopOnNotice())
        model.fit(data.x_train[..., None], data.y_train, epochs=args.epochs, batch_size=args.batch_size,
                  verbose=0, callbacks=callbacks)
        loss, accuracy = model.evaluate(data.x_test[..., None], data.y_test, verbose=0)
    else:
        model, loss, accuracy = train_multiworker(tf, keras, strategy, data, args, workers, EpochTimer())
    if not chief:
        # The same model as the chief's (it is one model); the chief alone writes it.
        print(f"test accuracy {accuracy:.4f}; worker {task} leaves the model to the chief")
        print("summary: " + json.dumps({
            "tensorflow": tf.__version__, "device": device, "strategy": args.strategy, "workers": workers,
            "task": task, "epochs": args.epochs, "epoch_seconds": [round(s, 4) for s in epoch_seconds],
            "test_accuracy": round(float(accuracy), 4), "model_path": None,
        }), flush=True)
        return 0

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
        "model_path": str(model_path), "strategy": args.strategy, "workers": workers, "task": task,
        "resumed_after_epochs": resumed,
    }), flush=True)
    return 0


def train_multiworker(tf, keras, strategy, data, args, workers: int, timer):
    """Data-parallel training over the cluster: (the model, its test loss, its test accuracy).

    A loop of its own rather than model.fit: Keras 3's fit cannot take a multi-worker
    strategy's batches (keras-team/keras#20585).  Each step every worker computes the
    gradients of its share of one global batch, the optimizer sums them across the
    workers (all-reduce), and every worker applies the same update: one model on all."""
    import numpy as np

    global_batch = args.batch_size * workers
    with strategy.scope():  # the variables are mirrored on every worker
        model = cnn_example.build_model(*data.x_train.shape[1:3])
    optimizer = model.optimizer
    per_example = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    train = tf.data.Dataset.from_tensor_slices((data.x_train[..., None], data.y_train))
    train = train.shuffle(len(data.y_train), seed=0).repeat().batch(global_batch)
    options = tf.data.Options()
    # Every worker reads the same arrays: shard by element (not by files, there are none).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batches = iter(strategy.experimental_distribute_dataset(train.with_options(options)))

    @tf.function
    def train_step(iterator):
        def step(x, y):
            with tf.GradientTape() as tape:
                probs = model(x, training=True)
                loss = tf.nn.compute_average_loss(per_example(y, probs), global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            right = tf.reduce_sum(tf.cast(tf.argmax(probs, axis=1) == tf.cast(y, tf.int64), tf.float32))
            return loss, right
        loss, right = strategy.run(step, args=next(iterator))
        total = tf.distribute.ReduceOp.SUM
        return strategy.reduce(total, loss, axis=None), strategy.reduce(total, right, axis=None)

    steps = math.ceil(len(data.y_train) / global_batch)
    for epoch in range(args.epochs):
        timer.on_epoch_begin(epoch)
        losses, right = [], 0.0
        for _ in range(steps):
            loss, correct = train_step(batches)
            losses.append(float(loss))
            right += float(correct)
        timer.on_epoch_end(epoch, {"loss": float(np.mean(losses)), "accuracy": right / (steps * global_batch)})
    # The model is the same on every worker: each scores it on the whole test set, locally.
    probs = np.asarray(model(data.x_test[..., None], training=False))
    loss = float(np.mean(np.asarray(per_example(data.y_test, probs))))
    return model, loss, float(np.mean(probs.argmax(axis=1) == data.y_test))


if __name__ == "__main__":
    sys.exit(main())
