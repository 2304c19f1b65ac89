"""The ledger's database: its tables, the statements run on every lease, the store (engine, locks,
transactions, retries), the ledger's own threads for calls made from an event loop, and the
batch jobs' records.

The lowest room of the pool: it imports only the pool's values (models.py, validation.py) and the
inventory, never another room.
"""
