"""The TensorFlow MKL notebook image, built by images/build.py and run in the real dockerd.

Every container runs with --network none: the workflow must work offline.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path

import pytest

from tests.fixtures.images import (
    IMAGES,
    LABEL_CUDA,
    LABEL_TF,
    LABEL_VARIANT,
    docker_run,
    image_config,
    image_labels,
    summary,
)

EXAMPLES = "/home/jovyan/tensorflow-examples"


def pinned_version(requirements: Path, package: str) -> str:
    m = re.search(rf"^{re.escape(package)}(?:\[[^\]]*\])?==(\S+)", requirements.read_text(), re.M)
    assert m, f"{package} is not pinned in {requirements}"
    return m.group(1)


def test_labels_user_and_init(mkl_image):
    labels = image_labels(mkl_image)
    assert labels[LABEL_VARIANT] == "mkl"
    assert labels[LABEL_TF] == pinned_version(IMAGES / "requirements" / "mkl.txt", "tensorflow-cpu")
    assert labels[LABEL_CUDA] == "none"
    config = image_config(mkl_image)
    assert config["Entrypoint"][0] == "/usr/bin/tini"

    out = docker_run(mkl_image, "sh", "-c", "id -u; cat /proc/1/comm; jupyterhub-singleuser --version")
    assert out.returncode == 0, out.stderr
    uid, pid1, hub_version = out.stdout.split()[:3]
    assert uid == "1000"                                   # not root
    assert pid1 == "tini"                                  # tini reaps the kernels' children
    assert hub_version == metadata.version("jupyterhub")   # speaks the hub's protocol


def test_train_one_epoch_with_onednn_then_predict(mkl_image):
    # From the copy start-notebook.sh put in the user's home, as a user would.
    # TF_CPP_MIN_LOG_LEVEL=0 shows TensorFlow's INFO line about oneDNN (the image hides INFO).
    out = docker_run(mkl_image, "sh", "-c",
                     f"cd {EXAMPLES} && python train.py --epochs 1 --model_path /tmp/model.keras"
                     " && echo ==== && python predict.py --model_path /tmp/model.keras",
                     env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert out.returncode == 0, out.stderr
    assert "oneDNN custom operations are on" in out.stderr
    train_out, predict_out = out.stdout.split("====\n")
    trained = summary(train_out)
    assert trained["onednn"] is True
    assert trained["source"] == "digits" and trained["device"] == "CPU"
    assert len(trained["epoch_seconds"]) == 1
    assert trained["test_accuracy"] > 0.5        # one epoch on digits: far above chance (0.1)
    predicted = summary(predict_out)
    assert predicted["count"] == 359             # the held-out 20 % of scikit-learn's 1797 digits
    assert predicted["accuracy"] > 0.5
    assert all(0 <= p <= 9 for p in predicted["predictions"])


# Writes a small MNIST-format data set (IDX, gzipped) from digits upscaled to
# 28x28, and the first test images as PNG files drawn dark-on-light like a
# user's scan.
MAKE_MNIST = r"""
import gzip, struct, numpy as np, os
from PIL import Image
from sklearn.datasets import load_digits
d = load_digits()
big = np.stack([np.asarray(Image.fromarray((im * 16).astype('uint8')).resize((28, 28))) for im in d.images])
os.makedirs('/tmp/mnist'); os.makedirs('/tmp/pngs')
def idx(name, a):
    head = struct.pack('>BBBB', 0, 0, 8, a.ndim) + struct.pack(f'>{a.ndim}I', *a.shape)
    with gzip.open(f'/tmp/mnist/{name}.gz', 'wb') as f: f.write(head + a.astype('uint8').tobytes())
idx('train-images-idx3-ubyte', big[:1500]); idx('train-labels-idx1-ubyte', d.target[:1500])
idx('t10k-images-idx3-ubyte', big[1500:]); idx('t10k-labels-idx1-ubyte', d.target[1500:])
for i in range(5):
    Image.fromarray(255 - big[1500 + i]).save(f'/tmp/pngs/{i}-label{d.target[1500 + i]}.png')
"""


def test_mnist_files_and_image_files_with_onednn_off(mkl_image):
    # One container for three things, to keep TensorFlow start-ups (slow on
    # 2 cores) few: MNIST files are read, image files are predicted, and the
    # switch the benchmark compares against (TF_ENABLE_ONEDNN_OPTS=0) really
    # turns oneDNN off.
    script = (f"python -c \"$MAKE_MNIST\" && cd {EXAMPLES}"
              " && python train.py --epochs 1 --model_path /tmp/m.keras --images_path /tmp/mnist"
              " && echo ==== && python predict.py --model_path /tmp/m.keras --images_path /tmp/pngs")
    out = docker_run(mkl_image, "sh", "-c", script,
                     env={"MAKE_MNIST": MAKE_MNIST, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert out.returncode == 0, out.stderr
    assert "oneDNN custom operations are on" not in out.stderr
    train_out, png_out = out.stdout.split("====\n")
    trained = summary(train_out)
    assert trained["onednn"] is False
    assert trained["source"] == "mnist:/tmp/mnist" and "28x28" in train_out
    assert trained["test_accuracy"] > 0.5
    pngs = summary(png_out)
    assert pngs["count"] == 5 and "accuracy" not in pngs     # unlabelled files
    # Each file is named after its true digit; a model at >50 % test accuracy
    # gets most of five right (dark-on-light input is inverted, as MNIST expects).
    results = re.findall(r"^\d-label(\d)\.png: (\d)\s", png_out, re.M)
    assert len(results) == 5, png_out
    assert sum(true == guess for true, guess in results) >= 3, png_out


@pytest.mark.parametrize("args, message", [
    (["train.py", "--model_path", "model.h6"], "must end in .keras"),
    (["train.py", "--images_path", "/nonexistent"], "no such directory"),
    (["train.py", "--images_path", "/tmp"], "no MNIST files there"),
    (["predict.py", "--model_path", "/tmp/none.keras"], "no such model file"),
])
def test_bad_input_is_a_clear_error(mkl_image, args, message):
    out = docker_run(mkl_image, "sh", "-c", f"cd {EXAMPLES} && python " + " ".join(args) + "; echo rc=$?; ls")
    assert "rc=2" in out.stdout
    assert message in out.stderr
    assert "model.h6" not in out.stdout     # nothing half-written


def test_starter_files_reach_home_without_overwriting(mkl_image):
    volume = f"gpuhub-test-home-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "volume", "create", volume], check=True, capture_output=True)
    try:
        home = [f"{volume}:/home/jovyan"]
        first = docker_run(mkl_image, "sh", "-c",
                           f"ls {EXAMPLES} && echo 'my own notes' > {EXAMPLES}/starter.ipynb"
                           f" && rm {EXAMPLES}/predict.py", volumes=home)
        assert first.returncode == 0, first.stderr
        assert {"starter.ipynb", "train.py", "predict.py", "cnn_example.py"} <= set(first.stdout.split())

        again = docker_run(mkl_image, "sh", "-c", f"cat {EXAMPLES}/starter.ipynb; ls {EXAMPLES}", volumes=home)
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith("my own notes\n")   # the user's change survives a restart
        assert "predict.py" in again.stdout                # a missing starter file comes back
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)


def test_warm_build_reuses_the_image(mkl_image, notebook_base_image):
    before = image_config(mkl_image)
    out = subprocess.run([sys.executable, str(IMAGES / "build.py"), "--variant", "mkl",
                          "--base-image", notebook_base_image], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == mkl_image
    assert "is up to date" in out.stderr and "docker build" not in out.stderr
    assert image_config(mkl_image) == before


# -- none of the host's pip settings in the image ---------------------------------------

PATH_KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host", "proxy", "cert",
             "client-cert", "constraint", "requirement")


def host_pip_values() -> set[str]:
    """Every URL, host or path the host's pip is configured with (config files and PIP_* env)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    values: set[str] = set()
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] in PATH_KEYS:
            values.update(value.strip("'\"").split())
    for key, value in os.environ.items():
        if key.startswith("PIP_") and key[4:].lower().replace("_", "-") in PATH_KEYS:
            values.update(value.split())
    return {v for v in values if len(v) > 3}


def pem_blocks(text: str) -> set[str]:
    return set(re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", text, re.S))


def test_image_keeps_none_of_the_hosts_pip_settings(mkl_image, notebook_base_image):
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", mkl_image],
                             capture_output=True, text=True, check=True).stdout
    for value in host_pip_values():
        assert value not in history, f"host pip setting {value!r} is in the image history"
    assert not re.search(r"index-url|PIP_INDEX|PIP_FIND_LINKS|PIP_CERT|https?://", history, re.I)
    assert "/tmp/wheelhouse" not in history     # no layer of the final image holds the wheels

    env = image_config(mkl_image)["Env"]
    assert not [e for e in env if e.startswith("PIP_")]

    leftovers = docker_run(mkl_image, "sh", "-c",
                           "ls -d /tmp/wheelhouse /tmp/requirements.txt /etc/pip.conf /etc/xdg/pip"
                           " /root/.pip /root/.config/pip 2>/dev/null;"
                           " find / -xdev \\( -name pip.conf -o -name pip.ini \\) 2>/dev/null; true")
    assert leftovers.stdout.strip() == ""

    bundle = "/etc/ssl/certs/ca-certificates.crt"
    image_ca = docker_run(mkl_image, "cat", bundle).stdout
    base_ca = docker_run(notebook_base_image, "cat", bundle, entrypoint="").stdout
    assert image_ca and hashlib.sha256(image_ca.encode()).digest() == hashlib.sha256(base_ca.encode()).digest()
    # Certificates only the host trusts (a proxy's or a mirror's CA) stayed on the host.
    host_bundles = [Path(v) for v in host_pip_values() if v.endswith((".crt", ".pem")) and Path(v).is_file()]
    host_only = set().union(*(pem_blocks(p.read_text()) for p in host_bundles)) - pem_blocks(base_ca)
    assert not host_only & pem_blocks(image_ca)
