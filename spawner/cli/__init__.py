"""`gpu-pool`: the admin command (status, leases, drain, doctor, agent, exec, ...).

    main              the command line: parser, ledger connection, the commands
    doctor            `gpu-pool doctor`: what a GPU host needs, line by line
    doctor_directory  the doctor's directory check, as the hub's login connects
    exec_client       `gpu-pool exec`: an action script through the pool service
"""

from .main import main

__all__ = ["main"]
