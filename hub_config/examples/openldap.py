# Log in with OpenLDAP: an example to copy into jupyterhub_config.py (or load
# with load_subconfig after the main config).  Adjust the DNs to your directory.
#
# auth_state (uid/gid for the notebook container, the user's groups) is stored
# encrypted: the hub needs JUPYTERHUB_CRYPT_KEY in its environment, e.g.
#   export JUPYTERHUB_CRYPT_KEY=$(openssl rand -hex 32)
import os

c = get_config()  # noqa: F821

c.JupyterHub.authenticator_class = "gpu-directory"
a = c.DirectoryAuthenticator
a.directory = "openldap"

# Where the directory is, and TLS.  StartTLS on 389 ("before_bind", the default)
# or LDAPS on 636 ("on_connect").  The certificate is verified against this CA.
a.server_address = "ldap.example.com"
a.tls_strategy = "before_bind"
a.tls_ca_file = os.environ.get("LDAP_CA_FILE", "")  # empty: the system's trusted CAs

# Users are looked up by uid under this base with a read-only service account,
# then the user's own password is checked by binding as the user.
a.user_search_base = "ou=people,dc=example,dc=com"
a.lookup_dn_search_user = "cn=jupyterhub,ou=services,dc=example,dc=com"
a.lookup_dn_search_password = os.environ["LDAP_BIND_PASSWORD"]

# Groups: groupOfNames (member), groupOfUniqueNames (uniqueMember) and
# posixGroup (memberUid) under this base; nested groupOfNames are followed.
a.group_search_base = "ou=groups,dc=example,dc=com"
a.allowed_groups = ["gpu-users"]          # names or DNs
a.admin_groups = ["jupyterhub-admins"]    # members become JupyterHub admins

# A directory that is down or hangs refuses logins after these, not never.
a.connect_timeout = 5.0
a.read_timeout = 10
