"""Plain TCP forwarders, for services that listen on one network namespace's loopback.

    python -m devservices.forward LISTEN_HOST:PORT TARGET_HOST:PORT [LISTEN TARGET ...]

Runs until SIGTERM or SIGINT.  `make demo-swarm` uses it to let the hub (in a
container's network namespace on the Swarm overlay) reach the demo directory
and PostgreSQL on the host's 127.0.0.1, through the docker0 gateway: the
addresses stay 127.0.0.1 on both ends, so TLS names still match.
"""

from __future__ import annotations

import asyncio
import signal
import sys


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(pairs: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    servers = []
    for listen, target in pairs:
        async def handle(reader, writer, target=target):
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        servers.append(await asyncio.start_server(handle, *listen))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("forwarding " + ", ".join(f"{a[0]}:{a[1]} -> {b[0]}:{b[1]}" for a, b in pairs), flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str]) -> int:
    if not argv or len(argv) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    pairs = [(_address(argv[i]), _address(argv[i + 1])) for i in range(0, len(argv), 2)]
    asyncio.run(serve(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
