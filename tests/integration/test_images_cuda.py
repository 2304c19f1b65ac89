"""The TensorFlow CUDA notebook image, without a GPU.

Opt-in (`make test-cuda-image`, i.e. GPUHUB_TEST_CUDA_IMAGE=1): the build
downloads about 2.6 GB of CUDA wheels.  No GPU is needed: these tests check
what the image promises before it meets one.
"""

from __future__ import annotations

import json
import re

from tests.fixtures.images import IMAGES, LABEL_CUDA, LABEL_TF, LABEL_VARIANT, docker_run, image_labels

CUDA_REQUIREMENTS = IMAGES / "requirements" / "cuda.txt"

PROBE = r"""
import json, tensorflow as tf
print(json.dumps({"built_with_cuda": tf.test.is_built_with_cuda(),
                  "build": {k: str(v) for k, v in tf.sysconfig.get_build_info().items()},
                  "gpus": len(tf.config.list_physical_devices("GPU")),
                  "version": tf.__version__}))
"""

# Load every CUDA library the image ships, as TensorFlow will on a GPU host.
LOAD_LIBS = r"""
import ctypes, glob, json, os, sysconfig
libs = sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "*", "lib", "lib*.so*")))
failed = {}
for path in libs:
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        failed[os.path.basename(path)] = str(exc)
print(json.dumps({"count": len(libs), "failed": failed}))
"""


def pinned(package: str) -> str:
    m = re.search(rf"^{re.escape(package)}(?:\[[^\]]*\])?==(\S+)", CUDA_REQUIREMENTS.read_text(), re.M)
    assert m, f"{package} is not pinned in {CUDA_REQUIREMENTS}"
    return m.group(1)


def test_labels_name_tensorflow_and_the_cuda_it_needs(cuda_image):
    labels = image_labels(cuda_image)
    assert labels[LABEL_VARIANT] == "cuda"
    assert labels[LABEL_TF] == pinned("tensorflow")
    runtime = pinned("nvidia-cuda-runtime-cu12")
    assert labels[LABEL_CUDA] == ".".join(runtime.split(".")[:2])   # e.g. "12.5"


def test_tensorflow_reports_a_cuda_build_without_a_gpu(cuda_image):
    out = docker_run(cuda_image, "python", "-c", PROBE)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["built_with_cuda"] is True
    assert info["version"] == pinned("tensorflow")
    assert info["gpus"] == 0                           # no GPU on this machine, and no crash either
    # The label is what the build needs, not less.
    build_cuda = tuple(int(x) for x in info["build"]["cuda_version"].split(".")[:2])
    label_cuda = tuple(int(x) for x in image_labels(cuda_image)[LABEL_CUDA].split("."))
    assert label_cuda >= build_cuda


def test_cuda_libraries_load_inside_the_image(cuda_image):
    # Only the driver's libcuda.so.1 is missing here; NVIDIA's hook mounts it from the host.
    out = docker_run(cuda_image, "python", "-c", LOAD_LIBS)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["count"] >= 10                       # cudart, cublas, cudnn, cufft, ... all shipped
    assert not {lib: err for lib, err in result["failed"].items() if "libcuda.so.1" not in err}
