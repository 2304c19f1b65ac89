"""The Docker engine (one host): the jobs runner's side (jobs.py)."""
