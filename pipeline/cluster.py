"""A client of an existing Dask cluster (`--scheduler ADDRESS`), shared by ingest (its units of
work: pipeline/ingest/executors.py) and analysis (one task per run: pipeline/analyze_cluster.py).
"""

from __future__ import annotations

from .lake import one_line

# how long the handshake with the scheduler may take, in seconds (a refused port is retried until
# then: distributed.comm.connect)
CONNECT_TIMEOUT_S = 10


class SchedulerError(RuntimeError):
    """The Dask scheduler could not be reached (one line, naming its address)."""


def client(scheduler: str):
    """A dask.distributed Client of the scheduler at `scheduler` (use it as a context manager).
    Raises SchedulerError (one line, naming the address) when the address is malformed or the
    scheduler cannot be reached."""
    import asyncio

    from distributed import Client
    from distributed.comm import connect, parse_address
    from distributed.comm.registry import get_backend

    async def handshake():  # Dask's own handshake: a port that refuses, or another service, fails here
        comm = await connect(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
        await comm.close()

    try:
        # the address and the scheduler are checked before a Client is made: a Client that fails
        # in its constructor waits another 60 s in __del__ and prints a traceback
        scheme, _ = parse_address(scheduler)
        get_backend(scheme)
        if scheme in ("tcp", "tls"):  # inproc:// lives in this process's own loop
            # in a thread of its own: asyncio.run() refuses to start where a loop already runs
            # (a notebook's, or Playwright's sync API in the same process)
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as pool:
                pool.submit(
                    lambda: asyncio.run(asyncio.wait_for(handshake(), CONNECT_TIMEOUT_S + 5))
                ).result()
        return Client(scheduler, set_as_default=False, timeout="20s")
    except Exception as e:  # refused, timed out, not an address, or not a Dask scheduler answering
        why = str(e) or ("no Dask scheduler answered within 15 s" if isinstance(e, TimeoutError) else "")
        raise SchedulerError(
            one_line(f"cannot reach the Dask scheduler at {scheduler}: {type(e).__name__}: {why}")
        ) from None
