"""The pool's fair use beyond the concurrency quotas: GPU-hour budgets (a rolling allowance per
user and per group) and bookings (GPUs of one host held for a user or a group over a window).

The grant (leasing/grant.py) asks both before it lends; the facade's part (allowances.py)
checks and exposes them.
"""
