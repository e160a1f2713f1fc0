"""Fixed costs of one grading job cut short, without changing what is graded.

``QuickKernelClient``: jupyter_client's ``wait_for_ready`` ends, once the kernel has answered,
by draining the IOPub channel until it has been quiet for 0.2 s; on a fresh kernel that is a
pure 0.2 s wait per notebook. nbclient reads IOPub by the id of the request it sent, so a
leftover status message from the start-up is skipped anyway: here the drain stops after 0.01 s
of quiet. (The job's config names it: ``c.KernelManager.client_factory``.)

``shared_engines``: nbgrader opens its gradebook (SQLAlchemy engine, schema check) half a dozen
times per autograde, each with a new engine that compiles the same SQL again. Within one job
process every open of the same database URL gets one engine, so its compiled statements are
reused; nbgrader's ``close`` still disposes of the connections.

``alembic_head_in_process``: nbgrader stamps every new gradebook with the head revision of its
database migrations, which it asks a subprocess for (``alembic heads``: about 4 s of CPU on the
course's machine, nearly all of it imports). The head is a constant of the installed nbgrader:
each process reads it once from nbgrader's migration scripts with alembic's own ``ScriptDirectory``
(0.2 s). Every throwaway course of a grading run or a test makes a new gradebook.
"""

from __future__ import annotations

import asyncio
import functools
import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient

DRAIN_QUIET_S = 0.01


class QuickKernelClient(AsyncKernelClient):
    async def wait_for_ready(self, timeout: float | None = None) -> None:
        """Block until the kernel answers ``kernel_info`` with its IOPub channel connected
        (as jupyter_client does), then drain IOPub until ``DRAIN_QUIET_S`` of quiet."""
        deadline = time.time() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                msg = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                msg = None
            if msg is not None and msg["msg_type"] == "kernel_info_reply":
                try:  # IOPub connected: the kernel's status message for that request reached us
                    await self.iopub_channel.get_msg(timeout=0.2)
                except Empty:
                    pass
                else:
                    self._handle_kernel_info_reply(msg)
                    break
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.time() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")
            await asyncio.sleep(0)
        while True:
            try:
                await self.iopub_channel.get_msg(timeout=DRAIN_QUIET_S)
            except Empty:
                break


def shared_engines() -> None:
    """In this process, nbgrader's gradebook reuses one SQLAlchemy engine per database URL."""
    from nbgrader import api
    from sqlalchemy import create_engine

    if getattr(api.create_engine, "_kvref_shared", False):
        return
    engines: dict = {}

    def engine(url, **kw):
        key = (str(url), tuple(sorted(kw.items())))
        if key not in engines:
            engines[key] = create_engine(url, **kw)
        return engines[key]

    engine._kvref_shared = True
    api.create_engine = engine


def alembic_head_in_process() -> None:
    """In this process, nbgrader's ``get_alembic_version`` reads the head revision without a subprocess."""
    from nbgrader import api

    if getattr(api.get_alembic_version, "_kvref_in_process", False):
        return
    asked = api.get_alembic_version  # nbgrader's own: `alembic heads` in a subprocess

    @functools.cache
    def head() -> str:
        from alembic.script import ScriptDirectory
        from nbgrader import dbutil

        try:
            return ScriptDirectory(dbutil.ALEMBIC_DIR).get_current_head()
        except Exception:  # noqa: BLE001  (several heads, a moved folder: ask alembic as nbgrader does)
            return asked()

    head._kvref_in_process = True
    api.get_alembic_version = head
