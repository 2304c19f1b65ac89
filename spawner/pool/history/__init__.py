"""The ledger's record read back: leases and GPU states, the timeline, the hourly and daily
rollups (and the decayed use behind the fair-share order), the queue's hours.

The facade's part (reports.py) reads; the rollups are written by the leasing room as leases end
and requests leave the queue.
"""
