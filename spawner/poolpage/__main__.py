"""`python -m spawner.poolpage`: the gpu-pool service, as the hub starts it."""

from ..early_stop import stop_at_first_signal

stop_at_first_signal()  # before the imports of app, which take a second or two

from .app import main  # noqa: E402

main()
