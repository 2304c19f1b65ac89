# Log in with Active Directory: an example to copy into jupyterhub_config.py (or
# load with load_subconfig after the main config).  Adjust names to your domain.
#
# auth_state (uid/gid for the notebook container, the user's groups) is stored
# encrypted: the hub needs JUPYTERHUB_CRYPT_KEY in its environment, e.g.
#   export JUPYTERHUB_CRYPT_KEY=$(openssl rand -hex 32)
import os

c = get_config()  # noqa: F821

c.JupyterHub.authenticator_class = "gpu-directory"
a = c.DirectoryAuthenticator
a.directory = "active_directory"

# LDAPS on 636.  AD refuses simple binds without TLS; the certificate is
# verified against this CA (for Samba AD: <private dir>/tls/ca.pem).  If the
# certificate names the DC differently from server_address, list that name.
a.server_address = "dc1.corp.example.com"
a.tls_strategy = "on_connect"
a.tls_ca_file = os.environ.get("AD_CA_FILE", "")  # empty: the system's trusted CAs
# a.tls_kwargs = {"valid_names": ["dc1.corp.example.com"]}

# Users log in with sAMAccountName (alice) or userPrincipalName
# (alice@corp.example.com); both become the hub user "alice".
a.user_search_base = "OU=Staff,DC=corp,DC=example,DC=com"
a.lookup_dn_search_user = "CN=svc-jupyterhub,OU=Service Accounts,DC=corp,DC=example,DC=com"
a.lookup_dn_search_password = os.environ["AD_BIND_PASSWORD"]

# Groups, nested ones included (one LDAP_MATCHING_RULE_IN_CHAIN search), from
# the whole domain.  Disabled, locked and expired accounts are refused with a
# message saying so.  uidNumber/gidNumber (RFC 2307 attributes) become the
# container's uid:gid.
a.group_search_base = "DC=corp,DC=example,DC=com"
a.allowed_groups = ["GPU-Users"]
a.admin_groups = ["CN=JupyterHub Admins,OU=Groups,DC=corp,DC=example,DC=com"]

a.connect_timeout = 5.0
a.read_timeout = 10
