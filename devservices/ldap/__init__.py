"""Real directories for tests and `make demo`: OpenLDAP (slapd) and Samba AD.

Each module here starts a directory on 127.0.0.1 from Debian's packages and
seeds it from `seed.py`, the one place that says which users and groups exist.
"""
