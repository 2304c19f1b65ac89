"""images/build.py without Docker: labels read from wheels, pins, input hashing."""

from __future__ import annotations

import importlib.util
import re
import shutil
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[2] / "images"
_spec = importlib.util.spec_from_file_location("gpuhub_images_build", IMAGES / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

CPU_INFO = "build_info = collections.OrderedDict([('is_cuda_build', False), ('is_rocm_build', False)])\n"
CUDA_INFO = ("build_info = collections.OrderedDict([('cpu_compiler', '/usr/bin/clang'), "
             "('cuda_version', '12.5.1'), ('cudnn_version', '9'), ('is_cuda_build', True)])\n")


def fake_wheel(directory: Path, filename: str, build_info: str | None = None) -> Path:
    path = directory / filename
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("placeholder", "")
        if build_info is not None:
            zf.writestr("tensorflow/python/platform/build_info.py",
                        '"""Auto-generated module providing information about the build."""\n'
                        "import collections\n\n" + build_info)
    return path


def test_cpu_tensorflow_labels_no_cuda(tmp_path):
    fake_wheel(tmp_path, "tensorflow_cpu-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl", CPU_INFO)
    fake_wheel(tmp_path, "tensorflow_io_gcs_filesystem-0.37.1-cp311-cp311-manylinux_2_17_x86_64.whl")
    assert build.wheel_labels(tmp_path) == {"TF_VERSION": "2.21.0", "CUDA_VERSION": "none"}


@pytest.mark.parametrize("runtime, needed", [
    ("12.5.82", "12.5"),    # the libraries TF was built with
    ("12.9.79", "12.9"),    # newer runtime wheels raise what the driver must support
    (None, "12.5"),         # no runtime wheel: what TF was built with
])
def test_cuda_label_is_the_newer_of_build_and_runtime(tmp_path, runtime, needed):
    fake_wheel(tmp_path, "tensorflow-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl", CUDA_INFO)
    if runtime:
        fake_wheel(tmp_path, f"nvidia_cuda_runtime_cu12-{runtime}-py3-none-manylinux2014_x86_64.whl")
    assert build.wheel_labels(tmp_path) == {"TF_VERSION": "2.21.0", "CUDA_VERSION": needed}


def test_no_tensorflow_no_labels(tmp_path):
    fake_wheel(tmp_path, "jupyterlab-4.6.6-py3-none-any.whl")
    assert build.wheel_labels(tmp_path) == {}


def test_two_tensorflow_wheels_are_an_error(tmp_path):
    fake_wheel(tmp_path, "tensorflow-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl", CUDA_INFO)
    fake_wheel(tmp_path, "tensorflow_cpu-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl", CPU_INFO)
    with pytest.raises(ValueError, match="more than one TensorFlow wheel"):
        build.wheel_labels(tmp_path)


def test_wheel_without_build_info_is_an_error(tmp_path):
    fake_wheel(tmp_path, "tensorflow-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl", "x = 1\n")
    with pytest.raises(ValueError, match="no build_info"):
        build.wheel_labels(tmp_path)


def _pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", text, re.M))


def test_tensorflow_variants_pin_one_tensorflow_version():
    mkl = _pins(build.requirements_text("mkl"))
    cuda = _pins(build.requirements_text("cuda"))
    assert mkl["tensorflow-cpu"] == cuda["tensorflow"]
    assert "tensorflow" not in mkl and "tensorflow-cpu" not in cuda
    # Every CUDA library is pinned: pip's newest 12.x would raise the driver the image needs.
    cuda_text = (IMAGES / "requirements" / "cuda.txt").read_text()
    nvidia = re.findall(r"^(nvidia-\S+?)(==|>=|<|$)", cuda_text, re.M)
    assert nvidia and all(op == "==" for _, op in nvidia)


@pytest.mark.parametrize("variant", sorted(build.VARIANTS))
def test_singleuser_pinned_to_the_hubs_jupyterhub(variant):
    assert _pins(build.requirements_text(variant))["jupyterhub"] == metadata.version("jupyterhub")


def test_workflow_changes_rebuild_tensorflow_images_only(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "image_id", lambda ref: None)   # no Docker needed
    workflow = tmp_path / "workflow"
    workflow.mkdir()
    (workflow / "train.py").write_text("v1")
    monkeypatch.setattr(build, "WORKFLOW_DIR", workflow)

    def hashes():
        return {v: build.inputs_hash(v, "base:1", build.requirements_text(v)) for v in build.VARIANTS}

    before = hashes()
    (workflow / "train.py").write_text("v2")
    after = hashes()
    assert after["minimal"] == before["minimal"]
    assert after["mkl"] != before["mkl"] and after["cuda"] != before["cuda"]
    assert len(set(after.values())) == 3


def test_extension_and_bytecode_changes_rebuild_every_image(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "image_id", lambda ref: None)   # no Docker needed
    images = tmp_path / "images"
    shutil.copytree(build.HERE, images, ignore=shutil.ignore_patterns(*build.BUILD_OUTPUTS, "*.pyc"))
    monkeypatch.setattr(build, "HERE", images)

    def hashes(bytecode="warmup"):
        return {v: build.inputs_hash(v, "base:1", build.requirements_text(v), bytecode) for v in build.VARIANTS}

    before = hashes()
    extension = images / "jupyter" / "gpuhub_activity" / "__init__.py"
    extension.write_text(extension.read_text() + "\n# changed\n")
    after_extension = hashes()
    (images / "bytecode.py").write_text((images / "bytecode.py").read_text() + "\n# changed\n")
    after_bytecode = hashes()
    for variant in build.VARIANTS:
        assert len({before[variant], after_extension[variant], after_bytecode[variant]}) == 3
    # Measurement builds (all / none) never share a tag with the shipped images.
    assert len(set(hashes("all").values()) | set(hashes("none").values()) | set(after_bytecode.values())) == 9


def test_lab_extension_sources_rebuild_and_local_build_outputs_do_not(tmp_path, monkeypatch):
    """The TypeScript and the lock file are inputs of every image; what a local `npm ci` or
    `tsc` leaves beside them (node_modules, lib, build) is not, and never enters a context."""
    monkeypatch.setattr(build, "image_id", lambda ref: None)
    images = tmp_path / "images"
    shutil.copytree(build.HERE, images, ignore=shutil.ignore_patterns(*build.BUILD_OUTPUTS, "*.pyc"))
    monkeypatch.setattr(build, "HERE", images)

    def digest():
        return build.inputs_hash("minimal", "base:1", build.requirements_text("minimal"))

    before = digest()
    ext = images / "jupyter" / "labextension"
    for output in ("node_modules/x/index.js", "lib/index.js", "tsconfig.tsbuildinfo"):
        (ext / output).parent.mkdir(parents=True, exist_ok=True)
        (ext / output).write_text("built here")
    (images / "jupyter" / "build" / "labextension").mkdir(parents=True)
    (images / "jupyter" / "build" / "labextension" / "package.json").write_text("{}")
    assert digest() == before
    assert not any("node_modules" in p.parts or "lib" in p.parts for p in build._context_paths())
    source = ext / "src" / "index.ts"
    source.write_text(source.read_text() + "\n// changed\n")
    assert digest() != before
    lock = ext / "package-lock.json"
    lock.write_text(lock.read_text().replace("{", "{ ", 1))
    assert len({before, digest()}) == 2
