#!/bin/sh
# Starts OpenSSH's sshd inside a notebook container, as the container's own user (never
# root), on a non-privileged port, for the hub's SSH gateway (docs/users/ssh.md).
#
# The spawner hands over, per server: the one public key sshd accepts (the gateway's key
# for this server; no password is ever accepted), the host key sshd proves itself with,
# the login name and the port.  Nothing is written to the home: sshd's files live in a
# private directory under /tmp.  The container's uid may have no entry in /etc/passwd
# (directory uids); nss_wrapper gives sshd and the sessions it starts one, named after
# the login, without touching /etc/passwd.
set -eu
: "${GPUHUB_SSH_AUTHORIZED_KEY:?}" "${GPUHUB_SSH_HOST_KEY:?}"
PORT=${GPUHUB_SSH_PORT:-2222}
LOGIN=${GPUHUB_SSH_LOGIN:-jovyan}
HOME_DIR=${HOME:-/home/jovyan}
NSS=$(ls /usr/lib/*/libnss_wrapper.so 2>/dev/null | head -n1)
d=$(mktemp -d /tmp/gpuhub-sshd.XXXXXX)
chmod 700 "$d"
uid=$(id -u); gid=$(id -g)
awk -F: -v u="$uid" -v n="$LOGIN" '$3 != u && $1 != n' /etc/passwd > "$d/passwd"
echo "$LOGIN:x:$uid:$gid:$LOGIN:$HOME_DIR:/bin/bash" >> "$d/passwd"
awk -F: -v g="$gid" '$3 != g' /etc/group > "$d/group"
echo "$LOGIN:x:$gid:" >> "$d/group"
printf '%s\n' "$GPUHUB_SSH_HOST_KEY" > "$d/host_key"
chmod 600 "$d/host_key"
printf '%s\n' "$GPUHUB_SSH_AUTHORIZED_KEY" > "$d/authorized_keys"
# The sessions get the container's environment (GPUs, threads, PATH), less its secrets.
setenv=""
for name in $(env | sed -n 's/^\([A-Z_][A-Z0-9_]*\)=.*/\1/p' | sort -u); do
    case $name in
        GPUHUB_SSH_*|JUPYTERHUB_API_TOKEN|JPY_API_TOKEN|JUPYTERHUB_OAUTH_*|HOME|PWD|OLDPWD|SHLVL|HOSTNAME|_) continue ;;
    esac
    value=$(printenv "$name")
    case $value in *'"'*|*'
'*) continue ;; esac
    setenv="$setenv \"$name=$value\""
done
if [ -n "$NSS" ]; then
    setenv="$setenv \"LD_PRELOAD=$NSS\" \"NSS_WRAPPER_PASSWD=$d/passwd\" \"NSS_WRAPPER_GROUP=$d/group\""
fi
cat > "$d/sshd_config" <<CONF
Port $PORT
HostKey $d/host_key
PidFile $d/sshd.pid
AuthorizedKeysFile $d/authorized_keys
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin no
AllowUsers $LOGIN
AllowTcpForwarding local
PermitOpen localhost:* 127.0.0.1:* [::1]:*
AllowAgentForwarding no
AllowStreamLocalForwarding no
X11Forwarding no
PermitTunnel no
GatewayPorts no
PrintMotd no
MaxSessions 64
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
SetEnv$setenv
CONF
if [ -n "$NSS" ]; then
    export LD_PRELOAD="$NSS" NSS_WRAPPER_PASSWD="$d/passwd" NSS_WRAPPER_GROUP="$d/group"
fi
# Daemonizes once it listens; its log goes to the container's log.
exec /usr/sbin/sshd -e -f "$d/sshd_config"
