"""Lending GPUs: the grant transaction, the wait in the queue, release, the quotas and the
queue's order (fair-share or FIFO), and which free GPUs a lease gets.

It reads the fair-use room (budgets, bookings) and the history room (the decayed use behind the
fair-share order) inside the grant, and writes through the ledger room.
"""
