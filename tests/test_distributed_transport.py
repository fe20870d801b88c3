"""The copy-engine transport's protocol on the CPU: each rank a thread, symmetric memory and its signal pads
simulated (a copy lands at once; a signal wait blocks until the matching put). Checks where every row lands,
that every put is consumed by exactly one wait, that rank r sends to r+1, r+2, ... first, and that waiting
for one sender at a time (finish_from) then finish() leaves nothing pending. The GPU run of the real thing
is tests/test_distributed.py's copy-engine cases (2+ CUDA devices)."""
import contextlib
import threading

import pytest
import torch

from sparsetorch.distributed import transport as T


class _World:
    """The signal pads of every rank: counts[(pad owner, channel, source rank)], 0 or 1."""

    def __init__(self, size):
        self.size = size
        self.counts = {}
        self.cond = threading.Condition()
        self.copies = {r: [] for r in range(size)}  # per sender: the receivers, in the order it copied

    def put(self, owner, channel, source):
        """As the hardware's compare-and-swap 0 -> 1: a put waits until the previous one was consumed."""
        key = (owner, channel, source)
        with self.cond:
            if not self.cond.wait_for(lambda: self.counts.get(key, 0) == 0, timeout=10):
                raise TimeoutError(f"rank {source} put signal {channel} to rank {owner} twice: never consumed")
            self.counts[key] = 1
            self.cond.notify_all()

    def wait(self, owner, channel, source):
        key = (owner, channel, source)
        with self.cond:
            if not self.cond.wait_for(lambda: self.counts.get(key, 0) > 0, timeout=10):
                raise TimeoutError(f"rank {owner} waited for signal {channel} from {source}: never put")
            self.counts[key] -= 1


class _Handle:
    def __init__(self, world, rank):
        self.world, self.rank = world, rank

    def put_signal(self, dst, channel, timeout_ms):
        self.world.put(dst, channel, self.rank)

    def wait_signal(self, src, channel, timeout_ms):
        self.world.wait(self.rank, channel, src)


class _Stream:
    def wait_stream(self, other):
        pass


class _Comm:
    def __init__(self, rank, size):
        self.rank, self.size, self.device = rank, size, torch.device("cpu")


@pytest.fixture
def fake_cuda_streams(monkeypatch):
    """Streams as no-ops: every operation of the simulation runs in order on its thread."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)


def _engines(world, counts, n, dtype):
    size = len(counts)
    max_rows = max(max(sum(row) for row in counts), max(sum(counts[p][r] for p in range(size)) for r in range(size)))
    nbytes = max_rows * n * torch.tensor([], dtype=dtype).element_size()
    buffers = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(size)]
    engines = []
    for r in range(size):
        e = T.CopyEngine(_Comm(r, size), max_rows, timeout_ms=10_000)
        e.buffer, e.handle = buffers[r], _Handle(world, r)
        e.peers = [None if p == r else buffers[p] for p in range(size)]
        e._reserve = lambda nbytes: None  # the buffers above stand in for the symmetric ones
        engines.append(e)
    return engines


def _send_rows(r, counts, n, dtype):
    """Rank r's send buffer, grouped by destination in rank order; row value = (sender, receiver, index)."""
    size = len(counts)
    rows = [torch.tensor([[1000 * r + 100 * p + i] * n for i in range(counts[p][r])], dtype=dtype).reshape(-1, n)
            for p in range(size)]
    return torch.cat(rows)


def _expected(me, counts, n, dtype):
    """What rank me receives: grouped by source in rank order."""
    return torch.cat([torch.tensor([[1000 * s + 100 * me + i] * n for i in range(counts[me][s])], dtype=dtype)
                      .reshape(-1, n) for s in range(len(counts))])


@pytest.mark.parametrize("counts", [
    [[0, 3], [2, 0]],                                        # two ranks
    [[0, 2, 1], [4, 0, 0], [1, 5, 0]],                       # three, one rank sending nothing to another
    [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]],  # four
])
@pytest.mark.parametrize("one_sender_at_a_time", [False, True])
def test_copy_engine_rows_land_in_place_and_signals_pair(fake_cuda_streams, counts, one_sender_at_a_time):
    size, n, dtype = len(counts), 3, torch.float32
    world = _World(size)
    engines = _engines(world, counts, n, dtype)
    copied = {r: [] for r in range(size)}
    received, errors = {}, []

    def rank(r):
        e = engines[r]
        original_copy = T.CopyEngine._rows

        def rows_spy(buffer, first, nrows, ncols, dt):
            view = original_copy(buffer, first, nrows, ncols, dt)
            if buffer is not e.buffer:
                copied[r].append(next(p for p, b in enumerate(e.peers) if b is buffer))
            return view

        try:
            e._rows = rows_spy
            for round_ in range(2):  # two exchanges in a row: the buffer and the signal slots are reused
                recv, pending = e.start(_send_rows(r, counts, n, dtype) + round_, counts, "test")
                senders = list(pending["waiting"])
                assert senders == T.arrival_order(counts[r], r)
                if one_sender_at_a_time:
                    for p in senders:
                        e.finish_from(pending, p)
                        first = sum(counts[r][:p])
                        torch.testing.assert_close(recv[first:first + counts[r][p]],
                                                   _expected(r, counts, n, dtype)[first:first + counts[r][p]] + round_)
                e.finish(pending)
                assert pending["waiting"] == []
                torch.testing.assert_close(recv, _expected(r, counts, n, dtype) + round_)
            received[r] = recv.clone() - 1
        except Exception as exc:  # noqa: BLE001 - reported below with the rank
            errors.append((r, exc))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for r in range(size):
        torch.testing.assert_close(received[r], _expected(r, counts, n, dtype))
        # rank r writes to r+1 first, then r+2, ...: no receiver is written by every sender at once
        order = [p for p in ((r + d) % size for d in range(1, size)) if counts[p][r]]
        assert copied[r] == order * 2
    assert all(v == 0 for v in world.counts.values()), world.counts  # every signal put was waited for once


def test_arrival_order_is_the_senders_copy_order():
    # rank s copies to s+1 first: the receiver me hears from me-1 first, then me-2, ...
    assert T.arrival_order([1, 1, 1, 1], 0) == [3, 2, 1]
    assert T.arrival_order([1, 0, 1, 1], 2) == [0, 3]
    assert T.arrival_order([0, 5], 0) == [1]
    assert T.arrival_order([0, 0, 0], 1) == []
