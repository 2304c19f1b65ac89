"""The Docker engine: one host's dockerd runs each server as a container with device requests.

    spawner    GPUDockerSpawner (`gpu-docker`)
    jobs       DockerJobEngine: the jobs runner's units as containers
"""
