#!/usr/bin/env python3
"""Per-epoch time of the example CNN in the TensorFlow MKL image.

    .venv/bin/python bench/bench_tensorflow.py [--repeats 3] [--epochs 4] [--cpu-limits 2 1]

Four configurations, all in one run and interleaved (so machine drift hits
all of them alike), each in a container limited to `cpu_limit` CPUs as the
spawner's cpu_limit does (`--cpus`):

  oneDNN on  / threads unset   the baseline: the image as users get it
  oneDNN off / threads unset   TF_ENABLE_ONEDNN_OPTS=0: plain Eigen kernels
  oneDNN on  / threads set     OMP_NUM_THREADS / TF_NUM_INTRAOP_THREADS /
  oneDNN off / threads set     TF_NUM_INTEROP_THREADS from cpu_limit, as the spawner sets them

Data: scikit-learn's 8x8 digits (the workflow's offline default) and the same
digits upscaled to 28x28 (MNIST's size, the seed's workload shape).  Epoch 1
of each run is dropped (graph tracing); the table shows the median of the
rest and the ratio to the baseline.  Also prints the image sizes next to the
seed's tensorflow/tensorflow GPU image (3 GB, 5.5 GB for the next release).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = "/opt/gpuhub/skel/tensorflow-examples"   # the image's pristine copy
SEED_IMAGES = [("tensorflow/tensorflow:*-gpu (seed, as reported)", 3.0),
               ("tensorflow/tensorflow next -gpu (seed, as reported)", 5.5)]

# Digits upscaled to 28x28, written as MNIST IDX files, so train.py's MNIST path reads them.
MAKE_DIGITS28 = r"""
import gzip, struct, numpy as np
from PIL import Image
from sklearn.datasets import load_digits
d = load_digits()
big = np.stack([np.asarray(Image.fromarray((im * 16).astype('uint8')).resize((28, 28))) for im in d.images])
def idx(name, a):
    head = struct.pack('>BBBB', 0, 0, 8, a.ndim) + struct.pack(f'>{a.ndim}I', *a.shape)
    with gzip.open(f'/data/{name}.gz', 'wb') as f: f.write(head + a.astype('uint8').tobytes())
idx('train-images-idx3-ubyte', big[:1500]); idx('train-labels-idx1-ubyte', d.target[:1500])
idx('t10k-images-idx3-ubyte', big[1500:]); idx('t10k-labels-idx1-ubyte', d.target[1500:])
"""


def thread_env(cpu_limit: float) -> dict[str, str]:
    """The thread settings for a container limited to `cpu_limit` CPUs."""
    n = max(1, math.ceil(cpu_limit))
    return {"OMP_NUM_THREADS": str(n), "TF_NUM_INTRAOP_THREADS": str(n),
            "TF_NUM_INTEROP_THREADS": str(min(2, n))}


def build(variant: str) -> str:
    base = subprocess.run([str(ROOT / "images" / "build-base.sh")], capture_output=True, text=True, check=True)
    out = subprocess.run([sys.executable, str(ROOT / "images" / "build.py"), "--variant", variant,
                          "--base-image", base.stdout.strip()], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"building the {variant} image failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip()


def image_size_gb(ref: str) -> float | None:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", ref], capture_output=True, text=True)
    return int(out.stdout) / 1e9 if out.returncode == 0 else None


def train(image: str, cpu_limit: float, env: dict[str, str], epochs: int, data_dir: str | None) -> list[float]:
    cmd = ["docker", "run", "--rm", "--network", "none", "--cpus", str(cpu_limit)]
    for key, value in env.items():
        cmd += ["--env", f"{key}={value}"]
    args = ["python", f"{EXAMPLES}/train.py", "--epochs", str(epochs), "--model_path", "/tmp/m.keras"]
    if data_dir:
        cmd += ["--volume", f"{data_dir}:/data:ro"]
        args += ["--images_path", "/data"]
    cmd += [image, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"train.py failed in {image}:\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("summary: ")][-1]
    return json.loads(line.removeprefix("summary: "))["epoch_seconds"][1:]   # epoch 1 traces the graph


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="MKL image to measure (default: build/find it with images/build.py)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (default 3)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is dropped (default 4)")
    parser.add_argument("--cpu-limits", type=float, nargs="+", default=[2.0], help="cpu_limit values (default 2)")
    parser.add_argument("--data", nargs="+", choices=["digits", "digits28"], default=["digits", "digits28"])
    args = parser.parse_args()

    image = args.image or build("mkl")
    print(f"image {image}; host CPUs {os.cpu_count()}; {args.repeats} runs x {args.epochs} epochs "
          f"(epoch 1 dropped) per configuration\n", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-tf-") as tmp:
        data_dirs: dict[str, str | None] = {"digits": None}
        if "digits28" in args.data:
            os.chmod(tmp, 0o777)   # the image's user (uid 1000) writes the files
            subprocess.run(["docker", "run", "--rm", "--network", "none", "--volume", f"{tmp}:/data", image,
                            "python", "-c", MAKE_DIGITS28], check=True, capture_output=True)
            data_dirs["digits28"] = tmp

        for cpu_limit in args.cpu_limits:
            configs = {
                "oneDNN on,  threads unset": {"TF_ENABLE_ONEDNN_OPTS": "1"},
                "oneDNN off, threads unset": {"TF_ENABLE_ONEDNN_OPTS": "0"},
                "oneDNN on,  threads set": {"TF_ENABLE_ONEDNN_OPTS": "1", **thread_env(cpu_limit)},
                "oneDNN off, threads set": {"TF_ENABLE_ONEDNN_OPTS": "0", **thread_env(cpu_limit)},
            }
            for data in args.data:
                samples: dict[str, list[float]] = {name: [] for name in configs}
                started = time.monotonic()
                for _ in range(args.repeats):
                    for name, env in configs.items():      # interleaved
                        samples[name] += train(image, cpu_limit, env, args.epochs, data_dirs[data])
                base = statistics.median(samples["oneDNN on,  threads unset"])
                print(f"### cpu_limit={cpu_limit:g}, data={data} "
                      f"(threads set = {' '.join(f'{k}={v}' for k, v in thread_env(cpu_limit).items())}; "
                      f"{time.monotonic() - started:.0f} s)\n")
                print("| configuration | median epoch (s) | min (s) | max (s) | vs baseline |")
                print("|---|---:|---:|---:|---:|")
                for name, values in samples.items():
                    med = statistics.median(values)
                    print(f"| {name} | {med:.3f} | {min(values):.3f} | {max(values):.3f} | {med / base:.2f}x |")
                print(flush=True)

    print("### Image sizes\n")
    print("| image | size (GB) |")
    print("|---|---:|")
    for variant in ("minimal", "mkl", "cuda"):
        ref = f"gpuhub/notebook-{variant}:latest"
        size = image_size_gb(ref)
        print(f"| {ref} | {size:.2f} |" if size is not None else f"| {ref} | not built |")
    for name, size in SEED_IMAGES:
        print(f"| {name} | {size:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
