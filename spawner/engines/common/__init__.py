"""What the Docker and Swarm engines stand on, and share with the spawner side.

    container_spawner  GPUContainerSpawner: the spawner base on dockerspawner (homes, lock-down
                       checks, labels, adoption; configured as c.GPUDockerSpawner)
    containers         the hardening every container gets (non-root, no capabilities, limits)
    homes, labels, readiness   users' home volumes, our labels, when a server answers
    reconciler         the ledger <-> engine agreement loop; reconcile_containers its pass over
                       one dockerd's containers
    job_containers     DockerJobEngine: the jobs runner's units as containers
    firewall           the host's rules that keep users' containers apart
    docker_api         the one adapter over docker-py's private parts
    record             `Engine`: what one engine brings, in one record
"""
