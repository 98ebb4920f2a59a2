"""The background queue of ``deltasync.Publisher`` (``publish(..., background=True)``): one worker
thread, started when a version is queued and gone when the queue runs empty; at most
``max_pending`` versions outstanding; a failure handed to its Future and re-raised once, by the
next publish, ``raise_failure()`` or ``flush()``; ``close()`` (which refuses publishes first, then
waits for the ones already begun).
"""
from __future__ import annotations

import concurrent.futures
import threading

from ._errors import FailedPreconditionError


class _Job:
    __slots__ = ("run", "future", "claimed", "version", "relative", "behind")

    def __init__(self, run, future, version=None, relative=False):
        self.run = run
        self.future = future
        self.claimed = False  # its failure was raised to a waiting caller: not kept for later
        self.version = version
        # publish_changes: its changes are relative to the state the caller expects the
        # versions queued before it to leave.
        self.relative = relative
        self.behind = None  # the version whose failure it was queued behind (it never runs then)


class PublishQueue:
    """The Publisher's queue. ``Publisher.__init__`` sets its state: ``_cond``, ``_queue``,
    ``_outstanding``, ``_worker``, ``_failures``, ``_closed`` (and ``bucket``, ``max_pending``,
    ``_parted``)."""

    def raise_failure(self) -> None:
        """Re-raises the first background publish failure not raised yet (and forgets them all); never waits.

        publish() and publish_changes() call it first, so a background failure
        surfaces at the next publish, not only at flush().
        """
        with self._cond:
            failures, self._failures = self._failures, []
            self._failed_version = None  # the caller has been told (here, or by the failed call itself)
        if failures:
            raise failures[0]

    def _submit(self, run, background: bool, version=None, relative: bool = False):
        self._refuse_if_parted()
        self.raise_failure()
        with self._cond:
            if self._closed:
                raise FailedPreconditionError(f"publisher for {self.bucket} is closed")
            on_worker = self._worker is not None and threading.current_thread() is self._worker
            if not background and (self._outstanding == 0 or on_worker):
                # Nothing queued: run here, in order, with the caller's thread.
                # (From a Future callback on the worker thread, waiting for the
                # queue would wait for itself.)
                self._outstanding += 1
                inline = True
            else:
                inline = False
                while self._outstanding >= self.max_pending and not on_worker:
                    self._cond.wait()
                    if self._closed:
                        raise FailedPreconditionError(f"publisher for {self.bucket} is closed")
                future: concurrent.futures.Future = concurrent.futures.Future()
                future.set_running_or_notify_cancel()
                job = _Job(run, future, version, relative)
                if self._failed_version is not None:
                    # A failure not yet raised to the caller, who built this job before seeing it.
                    job.behind = self._failed_version
                self._queue.append(job)
                self._outstanding += 1
                self._start_worker()
                self._cond.notify_all()
        if inline:
            try:
                return run()
            finally:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()
        if background:
            return future
        # A synchronous publish behind queued ones: waits for its turn; its
        # failure is raised here (and not kept for flush()).
        try:
            return future.result()
        except BaseException:
            with self._cond:
                job.claimed = True
                exc = future.exception()
                self._failures = [f for f in self._failures if f is not exc]
            raise

    def _start_worker(self) -> None:
        # REQUIRES: self._cond held. The worker exits when the queue runs
        # empty (no idle thread keeps the Publisher alive) and is started
        # again by the next background publish. Not a daemon: the interpreter
        # waits for queued versions at exit instead of dropping them.
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name=f"deltasync-publisher({self.bucket})")
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._worker = None
                    return
                job = self._queue.pop(0)
            try:
                if job.relative and job.behind is not None:
                    # Its changes assume the failed version's: applied to the state
                    # before it they would commit weights that are not the trainer's.
                    raise FailedPreconditionError(
                        f"version {job.version} was not published: its changes were queued behind version "
                        f"{job.behind}, which failed, and would apply to the state before it; publish the "
                        "full weights, or the changes since the latest version, again")
                result = job.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the Future and to flush()
                with self._cond:
                    # Every job queued behind a failure: a relative one must not run.
                    failed = job.version if job.version is not None else "?"
                    for queued in self._queue:
                        if queued.behind is None:
                            queued.behind = failed
                    self._failed_version = failed
                # The Future first: its callbacks (a DeviceTracker marking
                # itself for a resync) run before the next publish can see
                # the failure through raise_failure().
                job.future.set_exception(exc)
                with self._cond:
                    if not job.claimed:
                        self._failures.append(exc)
            else:
                job.future.set_result(result)
            finally:
                job.run = None  # drops the references to the caller's arrays
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Versions queued or being published in the background."""
        with self._cond:
            return self._outstanding

    def flush(self) -> None:
        """Waits until every queued publish completed; re-raises the first background failure.

        Each failure is raised once: a second flush() after it returns normally
        (when nothing else failed).
        """
        if self._parted is not None:  # attach() publishes this publisher's model as parts
            self._parted.flush()
        with self._cond:
            if self._worker is not None and threading.current_thread() is self._worker:
                raise FailedPreconditionError("flush() from a publish's Future callback would wait for itself")
            while self._outstanding:
                self._cond.wait()
            failures, self._failures = self._failures, []
            self._failed_version = None
        if failures:
            raise failures[0]

    def close(self) -> None:
        """Refuses further publishes (FailedPreconditionError), then flush(). Idempotent.

        Ordered with publishes from other threads: one that began before close() (running, queued,
        or run inline) is waited for and its failure raised here; one that begins after is refused,
        and so is one still waiting for room in the queue. Nothing publishes after close() returns.
        """
        with self._cond:
            # First: a publish checking _closed after this point is refused, so the
            # flush below waits for every one that will ever run.
            self._closed = True
            self._cond.notify_all()  # publishes waiting for room are refused now
        try:
            self.flush()
        finally:
            with self._cond:
                worker = self._worker
            if worker is not None and worker is not threading.current_thread():
                worker.join()
