"""The gpu-pool service's handlers, one module per resource (as JupyterHub's `apihandlers/`).

    base         who is asking, ledger calls off the event loop, JSON errors without tracebacks
    actions      admin actions: drain/undrain, end a lease, action scripts
    history      usage over time: occupancy, queue length, GPU-hours
    jobs         /api/jobs and a job's page
    log_streams  following a job's log, bounded
    wait         live details for everyone: waits, utilisation, idle-cull deadlines
"""
