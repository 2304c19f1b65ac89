"""SSH (and scp, sftp, VS Code Remote-SSH) into one's own server, through the hub.

The `gpu-ssh` hub service runs an SSH gateway (asyncssh) on its own port.  It
authenticates a person as the hub does (the hub's own authenticator, so the
directory's rules: allowed groups, disabled and locked accounts), or by a public
key they registered on the service's page, or by a hub API token as password.
It then connects, over the Docker network, to an OpenSSH sshd inside *their*
container (started by the image as the container's own user, never root, and
accepting only this server's key, which the spawner made and only the hub's side
holds), and bridges the session: shell and exec channels, the SFTP subsystem,
local port forwards to the container's own ports.  Nobody can name another
person's container: the gateway picks the container from the authenticated name.

Modules: settings (SSHGateway, the admin's limits), server_keys (per-server keys
and where a server's sshd is, shared by spawner and gateway), spawner_access (the
spawner's part), logins (who is connecting), throttle (slowing guessing),
hub_client (the hub's REST API), server_access (whether a login's roles reach its
server), bridge (channels relayed to the container), gateway (the SSH server), key_store and
keys_api (registered public keys), app (the service process).  What the hub's config says about
the service is settings/ssh_service.py.
"""

SERVICE_NAME = "gpu-ssh"

__all__ = ["SERVICE_NAME"]
