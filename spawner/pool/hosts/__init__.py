"""The hosts and their GPUs as the ledger records them: the inventory synced in, drain and undrain,
reconciling a host against its containers, re-homing a renamed host, and the readings the
per-node agent writes (utilisation, memory, CUDA version).
"""
