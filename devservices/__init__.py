"""Services the demo and the test suite run on this machine, on loopback only.

`ldap/`: OpenLDAP (slapd) and Samba Active Directory, each in a directory of
its own and seeded with the demo's users and groups; `postgres`: a PostgreSQL
cluster of its own (the Swarm demo's ledger); `swarm`: a multi-node Docker
Swarm on this machine; `ports`: free loopback ports; `apt`: the one installer
of Debian packages they (and the test fixtures) use.  Part of the demo, so
the demo never imports test code; not part of the `spawner` distribution.
"""
