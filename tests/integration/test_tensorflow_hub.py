"""The MKL image through the hub: the CPU profile spawns it and a kernel imports TensorFlow."""

from ..fixtures.kernels import Kernel


def test_cpu_profile_spawns_the_mkl_image_and_a_kernel_runs_tensorflow(make_hub, mkl_image, docker_client):
    hub = make_hub(env={"GPUHUB_CPU_IMAGE": mkl_image})
    hub.create_user("tess")
    hub.start_server("tess", {"profile": "tf-cpu"}, timeout=180)
    kernel = Kernel(hub, "tess", hub.user_token("tess"))
    out = kernel.run(
        "import os, tensorflow as tf\n"
        "print('tf', tf.__version__)\n"
        "print('gpus', len(tf.config.list_physical_devices('GPU')))\n"
        "print('threads', os.environ.get('OMP_NUM_THREADS'))\n"
        "print('sum', int(tf.reduce_sum(tf.ones((3, 3)))))\n",
        timeout=180,
    )
    labels = docker_client.images.get(mkl_image).labels
    assert f"tf {labels['org.jupyter.gpuhub.tensorflow-version']}" in out
    assert "gpus 0" in out  # the CPU profile: no GPU, not even a visible one
    assert "threads 2" in out  # from the profile's cpu_limit
    assert "sum 9" in out
    # The starter workflow is in the user's home.
    r = hub.api("GET", "/users/tess")  # still running
    assert r.json()["servers"][""]["ready"]
    listing = Kernel(hub, "tess", hub.user_token("tess")).run(
        "import os; print(sorted(os.listdir(os.path.expanduser('~/tensorflow-examples'))))")
    assert "train.py" in listing and "starter.ipynb" in listing
