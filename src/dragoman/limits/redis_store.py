"""Token buckets in Redis, shared by every worker and replica.

One Lua script (`STEP`), one round trip, atomic in Redis, per request: it first applies
the settlements queued since the last call (requests that ended: their real token
counts), then refills, checks and takes from all of this request's buckets or none. A
settlement thus rides along with the next request's round trip, or goes on its own
within `FLUSH_AFTER` seconds if none comes. Time is Redis's own (`TIME`), so the hosts'
clocks need not agree. A bucket is a hash {t: tokens, at: ms} that expires once it
would be full again. The calls go over `resp.Pipe`: concurrent requests' scripts share
one write and one round trip, each with its own reply.

Redis unreachable: `fail_open` serves on buckets in this process, each holding its share
of the rate from the level Redis last reported (`fallback`), `fail_closed` answers 503;
logged once per outage, failed calls counted in `dragoman_limits_store_errors` and the
requests so decided in `dragoman_store_outage_requests`. Either
way Redis is tried again after `retry_after` seconds, so the gateway recovers by itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from dragoman.core.errors import GatewayError
from dragoman.limits.credit import CREDIT_TTL, Credit, granted
from dragoman.limits.fallback import Share
from dragoman.limits.resp import Pipe, bulk, supported
from dragoman.limits.scripts import SEED, STEP
from dragoman.limits.store import LocalStore, Taken, Want, refused

log = logging.getLogger("dragoman.limits")

RETRY_AFTER = 1.0  # seconds after a failure before Redis is asked again
FLUSH_AFTER = 0.1  # seconds a settlement waits at most for a request to ride along with
ENCODED_MAX = 4096  # wants whose encoding is remembered (a request's mostly repeat)


class LimitsUnavailable(GatewayError):
    """Redis is unreachable and `on_redis_error` is `fail_closed`."""

    status = 503
    type = "api_error"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _args(wants: Sequence[Want], settling: Sequence[tuple[Want, float]]) -> list[float | int]:
    """STEP's arguments after the first (n), for redis-py."""
    args: list[float | int] = []
    for w in wants:
        args += (w.capacity, w.per_second / 1000, w.cost, w.need, _ms(w.ttl))
    for w, delta in settling:
        args += (w.capacity, w.per_second / 1000, _ms(w.ttl), delta)
    return args


class RedisStore:
    def __init__(self, url: str, *, prefix: str, timeout: float, fail_open: bool,
                 on_error: Callable[[], None] = lambda: None,
                 on_outage: Callable[[str], None] = lambda decision: None,
                 retry_after: float = RETRY_AFTER, credit: int = 0) -> None:  # fmt: skip
        # No retries of its own, whatever redis-py's default (it has changed between versions): a
        # failure is answered at once under on_redis_error, not after seconds of backoff.
        self.client = redis.asyncio.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                             retry=Retry(NoBackoff(), 0))  # fmt: skip
        # The hot path's calls go over dragoman's own pipelined connection (`resp`); redis-py
        # keeps the heartbeat, and everything for a URL with options only redis-py reads.
        self.pipe = Pipe(url, timeout) if supported(url) else None
        self._step = self.script(STEP)
        self._seed = self.script(SEED)
        self.prefix = prefix
        self.fail_open = fail_open
        self._on_error = on_error
        self._on_outage = on_outage  # called with "admitted" or "refused" for a request Redis was out for
        self.share = Share(self.client, prefix)
        logging.getLogger("redis").setLevel(logging.ERROR)  # its own lines quieted: one warning per outage here
        self._local = LocalStore()  # while Redis is away, under fail_open
        self._down_until: float | None = None  # set while Redis is failing
        self._retry_after = retry_after  # seconds after a failure before Redis is asked again
        self._queued: list[tuple[Want, float]] = []  # settlements waiting for the next round trip
        self._flush: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._asks: dict[tuple[object, ...], asyncio.Task[None]] = {}  # credit asked ahead (`_ahead`)
        self._encoded: dict[Want, tuple[bytes, bytes, bytes]] = {}  # by want: see `_encode`
        self._credit = credit  # requests admitted ahead per round trip, at most (credit.py)
        self._extra = bulk(credit)
        self._credits: dict[tuple[object, ...], Credit] = {}
        self._credited: dict[str, set[tuple[object, ...]]] = {}  # by bucket: the credits that count it
        self._asking: set[tuple[object, ...]] = set()  # wants whose request in flight asks credit
        self._recent: dict[tuple[object, ...], float] = {}  # wants -> when last taken (`_again`)

    def script(self, source: str) -> Callable[..., Awaitable[Any]]:
        """`source` as a callable `(keys=..., args=...)`, over the pipe where there is one."""
        return self.pipe.script(source) if self.pipe is not None else self.client.register_script(source)

    def down(self) -> bool:
        return self._down_until is not None and time.monotonic() < self._down_until

    async def take(self, wants: Sequence[Want]) -> Taken:
        self.share.start()
        key = None  # with credit: the wants' buckets and costs, not the ttl (a budget's changes)
        if self._credit:
            key = tuple([(w.key, w.capacity, w.per_second, w.cost, w.need) for w in wants])
            taken = self._from_credit(key)
            if taken is None and key in self._asks:  # the next credit is on its way: sooner than asking
                await asyncio.shield(self._asks[key])
                taken = self._from_credit(key)
            if taken is not None:
                if not self._credits[key].left:
                    self._ahead(key, wants)
                return taken
            self._give_back(key)  # used up or past: its rest goes back
        if self.down():
            return self._fallback(wants)
        settling = self._take_queued()
        asking = self._credit if key is not None and key not in self._asking and self._again(key) else 0
        if asking:  # one request at a time asks credit, for wants taken before
            self._asking.add(key)  # type: ignore[arg-type]
        try:
            stepped = await self._run(wants, settling, asking)
        finally:
            if asking:
                self._asking.discard(key)  # type: ignore[arg-type]
        if stepped is None:
            return self._fallback(wants)
        reply, levels = stepped
        n = len(wants)
        if reply[0] == 1:
            extra = int(reply[n + 1]) if asking and len(reply) > n + 1 else 0
            return self._granted(key, wants, levels, extra) if extra else Taken(True, levels)  # type: ignore[arg-type]
        taken = self._from_credit(key) if key is not None else None  # given beside this one meanwhile
        return taken or refused(levels, wants) or Taken(False, levels, 0, 0.001)  # refilled meanwhile: ask again soon

    def _ahead(self, key: tuple[object, ...], wants: Sequence[Want]) -> None:
        """The credit for `key` just spent: the next is asked now, in a task of its own, so that
        the request that would have asked it finds it (at concurrency 1 the round trip was 0.4 ms
        and 0.17 ms of CPU on the path of every 32nd request: a sixth of the slowest 1 %)."""
        if key in self._asking or self.down():
            return
        self._asking.add(key)
        task = self._asks[key] = asyncio.get_running_loop().create_task(self._ask_ahead(key, wants))
        task.add_done_callback(lambda done: self._asks.pop(key) if self._asks.get(key) is done else None)

    async def _ask_ahead(self, key: tuple[object, ...], wants: Sequence[Want]) -> None:
        """STEP for no request (a negative extra): what it takes, its own share included, is
        the new credit; near the edge it takes nothing and the next request asks Redis itself."""
        try:
            stepped = await self._run(wants, self._take_queued(), -self._credit)
        finally:
            self._asking.discard(key)
        if stepped is not None and stepped[0][0] == 1:
            reply, levels = stepped
            self._granted(key, wants, levels, int(reply[len(wants) + 1]) + 1)

    async def _run(self, wants: Sequence[Want], settling: list[tuple[Want, float]],
                   extra: int) -> tuple[list[Any], list[float]] | None:  # fmt: skip
        """STEP's reply and the buckets' levels (reported to the outage share), or None when
        Redis failed (counted; the settlements kept for later)."""
        try:
            reply = await self._call(wants, settling, extra)
        except (RedisError, OSError, TimeoutError) as error:
            self.failed(error, settling)
            return None
        levels = [float(level) for level in reply[1 : len(wants) + 1]]
        self.share.reported(wants, levels)
        return reply, levels

    def _from_credit(self, key: tuple[object, ...]) -> Taken | None:
        """A request admitted from the credit these wants hold, if any is left and in time."""
        credit = self._credits.get(key)
        if credit is not None and credit.left and time.monotonic() < credit.until:
            return credit.use()
        return None

    def _again(self, key: tuple[object, ...]) -> bool:
        """Whether these wants were taken in the last CREDIT_TTL: credit is asked only for those
        (a key seen once, or wants that change with each request, would take it for nothing)."""
        now = time.monotonic()
        last = self._recent.get(key)
        if len(self._recent) >= ENCODED_MAX:
            self._recent.clear()
        self._recent[key] = now
        return last is not None and now - last < CREDIT_TTL

    def _granted(self, key: tuple[object, ...], wants: Sequence[Want], levels: list[float], extra: int) -> Taken:
        taken, credit = granted(wants, levels, extra, time.monotonic() + CREDIT_TTL)
        if credit is not None:
            self._give_back(key)  # one credit per wants: an earlier one's rest goes back
            self._credits[key] = credit
            for want in wants:
                self._credited.setdefault(want.key, set()).add(key)
            asyncio.get_running_loop().call_later(CREDIT_TTL, self._give_back, key, credit)
        return taken

    def _give_back(self, key: tuple[object, ...], credit: Credit | None = None) -> None:
        """The credit for `key` ended (that one, when given): what it did not admit goes back."""
        held = self._credits.get(key)
        if held is None or (credit is not None and held is not credit):
            return
        del self._credits[key]
        for want in held.wants:
            keys = self._credited.get(want.key)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._credited[want.key]
        self.adjust(held.unused())

    def _charged(self, changes: Sequence[tuple[Want, float]]) -> None:
        """A settlement here lowers the levels the credits hold; one whose bucket charged only at
        the end (cost 0: input tokens, a budget) falls under half full gives the rest back."""
        for want, delta in changes:
            for key in list(self._credited.get(want.key, ())) if delta < 0 else ():
                credit = self._credits.get(key)
                if credit is not None and not credit.charged(want, delta):
                    self._give_back(key)

    async def _call(self, wants: Sequence[Want], settling: Sequence[tuple[Want, float]], extra: int = 0) -> list[bytes]:
        if self.pipe is None:
            reply = await self._step(keys=[self.prefix + w.key for w in (*wants, *(w for w, _ in settling))],
                                     args=[len(wants), extra, *_args(wants, settling)])  # fmt: skip
        else:
            reply = await self._step.run(self._command(wants, settling, extra))  # type: ignore[attr-defined]
        self.back()
        return reply  # type: ignore[no-any-return]

    def _command(self, wants: Sequence[Want], settling: Sequence[tuple[Want, float]], extra: int) -> bytes:
        """STEP's EVALSHA in RESP, from each want's key and arguments encoded once (`_encoded`)."""
        keys, args = [], [bulk(len(wants)), self._extra if extra == self._credit else bulk(extra)]
        for want in wants:
            key, taking, _ = self._encoded.get(want) or self._encode(want)
            keys.append(key)
            args.append(taking)
        for want, delta in settling:
            key, _, settled = self._encoded.get(want) or self._encode(want)
            keys.append(key)
            args += (settled, bulk(delta))
        return self._step.command(keys, args, 2 + 5 * len(wants) + 4 * len(settling))  # type: ignore[attr-defined]

    def _encode(self, want: Want) -> tuple[bytes, bytes, bytes]:
        """`want`'s key, its five arguments as taken from, its first three as settled (RESP)."""
        if len(self._encoded) >= ENCODED_MAX:
            self._encoded.clear()
        head = (want.capacity, want.per_second / 1000)
        taking = b"".join(map(bulk, (*head, want.cost, want.need, _ms(want.ttl))))
        settled = b"".join(map(bulk, (*head, _ms(want.ttl))))
        encoded = self._encoded[want] = (bulk(self.prefix + want.key), taking, settled)
        return encoded

    def adjust(self, changes: Sequence[tuple[Want, float]]) -> None:
        """Queued for the next round trip; sent alone if none comes within FLUSH_AFTER (one timer at a
        time, not one per request: a settlement may go alone a little sooner)."""
        if not changes:
            return
        if self._credited:
            self._charged(changes)
        if self.down():
            if self.fail_open:
                self._local.adjust(changes)
            return
        self._queued.extend(changes)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(FLUSH_AFTER, self._flush_now)

    async def seed(self, changes: Sequence[tuple[Want, float]]) -> None:
        """One round trip; raises when Redis cannot be reached (the caller says what it costs)."""
        if not changes:
            return
        args: list[float | int] = []
        for want, delta in changes:
            args += (want.capacity, delta, _ms(want.ttl))
        await self._seed(keys=[self.prefix + want.key for want, _ in changes], args=args)

    def _take_queued(self) -> list[tuple[Want, float]]:
        queued, self._queued = self._queued, []  # the timer stays: it finds nothing, or later ones
        return queued

    def _flush_now(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not self._queued:
            return
        task = asyncio.get_running_loop().create_task(self._settle(self._take_queued()))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _settle(self, settling: list[tuple[Want, float]]) -> None:
        if not settling:
            return
        try:
            await self._call((), settling)
        except (RedisError, OSError, TimeoutError) as error:
            self.failed(error, settling)

    def _fallback(self, wants: Sequence[Want]) -> Taken:
        if not self.fail_open:
            self._on_outage("refused")
            raise LimitsUnavailable("the rate-limit store (Redis) is unreachable; try again shortly", retry_after="1")
        taken = self.share.take(self._local, wants)
        self._on_outage("admitted" if taken.admitted else "refused")
        return taken

    def failed(self, error: BaseException, settling: Sequence[tuple[Want, float]]) -> None:
        self._on_error()
        if self.fail_open:
            self._local.adjust(settling)  # what could not be settled in Redis counts here meanwhile
        if self._down_until is None:
            policy = "serving on this process's own buckets" if self.fail_open else "answering 503"
            log.warning("limits: Redis is unreachable (%s); %s until it is back", type(error).__name__, policy)
        self._down_until = time.monotonic() + self._retry_after

    def back(self) -> None:
        if self._down_until is not None:
            self._down_until = None
            self._local = LocalStore()  # the next outage starts from what Redis reports until then
            self.share.back()
            log.info("limits: Redis is reachable again; buckets are shared again")

    async def close(self) -> None:
        await self.share.close()
        if self._asks:  # a credit they bring goes back below with the others
            await asyncio.gather(*self._asks.values(), return_exceptions=True)
        for key in list(self._credits):
            self._give_back(key)
        self._flush_now()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self.pipe is not None:
            await self.pipe.close()
        await self.client.aclose()
