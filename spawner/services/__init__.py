"""What every hub-managed service of this project (the pool page, the SSH gateway, the culler)
shares with its hub.

    lifecycle  it ends with its hub, reads its settings from the hub's final config, stops its loops
    callers    who is asking it, asked of the hub without blocking its loop
    hub_api    its calls to the hub's REST API, with its own token
"""
