"""Services the demo and the test suite run on this machine, on loopback only.

`ldap/`: OpenLDAP (slapd) and Samba Active Directory, each in a directory of
its own and seeded with the demo's users and groups; `apt`: the one installer
of Debian packages they (and the test fixtures) use.  Part of the demo, so
the demo never imports test code; not part of the `spawner` distribution.
"""
