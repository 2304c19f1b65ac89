"""The Docker engine: one host's dockerd runs each server as a container with device requests.

    spawner    GPUDockerSpawner (`gpu-docker`)
"""
