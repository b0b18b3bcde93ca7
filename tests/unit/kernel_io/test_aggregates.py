"""Per-request counts from the kernel (req_agg, records.CallAggregate): the reader puts
each where its HTTP epoch ended, and the stitcher attributes it as the calls one by one."""
from __future__ import annotations

import random

from otel_gpu.kernel_io import reader as reader_module
from otel_gpu.kernel_io.kept_counts import KEY, VALUE
from otel_gpu.kernel_io.reader import AggregateReader, epoch_after
from otel_gpu.records import (EV_SOCK_READ, EV_SOCK_WRITE, Accept, AggregateRun, CallAggregate, ContextCopy, ProcExit,
                              SockIo)
from otel_gpu.pipeline.model import Request
from otel_gpu.pipeline.stitcher import Stitcher
from otel_gpu.cuda_calls import call_id
from otel_gpu.ratelimit import Stats
from tests.unit.pipeline import calls

PID, FD, LOOP = 4242, 10, 1
LAUNCH, MEMCPY, SYNC = call_id("cudaLaunchKernel"), call_id("cudaMemcpy"), call_id("cudaDeviceSynchronize")
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class _Entry(tuple):
    """A key tuple that is its own entry: two puts of equal keys stay two (as aggregates
    of separate reads would be), each deleted once."""
    __hash__, __eq__ = object.__hash__, object.__eq__


class FakeReqAgg(dict):
    """Stands in for the bcc hash (the real one is exercised by tests/bpf/test_request_aggregates.py):
    AggKey field tuples to AggValue field tuples, read and deleted as the kernel's bytes, as
    kernel_io/map_batch.BatchMap.packed() and delete() do."""

    def put(self, tgid, tid, epoch, call, detail=0x1000, ctx=0, count=1, nbytes=0, duration=0, ts=1):
        self[_Entry((tgid, tid, epoch, call, detail, ctx))] = (count, nbytes, duration, ts, ts, ts + duration)

    def delete(self, keys: bytes):
        """As BatchMap.delete: whether each key was still there (equal keys: one entry each)."""
        done = []
        for (fields,) in zip(KEY.iter_unpack(keys)):
            entry = next((k for k in self if tuple(k) == fields), None)
            done.append(entry is not None and dict.pop(self, entry, None) is not None)
        return done

    reads = 0

    def packed(self):
        self.reads += 1
        return (b"".join(KEY.pack(*k) for k in self), b"".join(VALUE.pack(*v) for v in self.values()))


def read(epoch, ts=0, pid=PID, raw=b"GET /r HTTP/1.1\r\nHost: x\r\n\r\n", tid=LOOP, ctx=0, fd=FD):
    return SockIo(EV_SOCK_READ, pid, tid, ts, fd, len(raw), raw, b"", ctx, epoch)


def write(epoch, ts=0, pid=PID, tid=LOOP, ctx=0, fd=FD):
    return SockIo(EV_SOCK_WRITE, pid, tid, ts, fd, len(OK), OK, OK[-8:], ctx, epoch)


def flat(out: list) -> list:
    """The reader's output with each AggregateRun's counts in its place."""
    return [a for o in out for a in (o.aggregates if o.__class__ is AggregateRun else (o,))]


def test_epochs_wrap():
    assert epoch_after(5, 4) and not epoch_after(4, 5) and not epoch_after(4, 4)
    assert epoch_after(1, 0xFFFFFFFF)


def test_an_aggregate_goes_before_the_first_record_that_ends_its_epoch():
    table = FakeReqAgg()
    table.put(PID, LOOP, 1, LAUNCH, count=40)   # made after the read (epoch 1)
    table.put(PID, LOOP, 2, LAUNCH, count=7)    # after the write: epoch 2 still running
    table.put(PID + 1, 9, 1, LAUNCH, count=3)   # another process: its epoch never ended
    r = AggregateReader(table, stats := Stats())
    batch = [read(1), "streamed call", write(2)]
    out = r.merge(batch)
    assert out[:2] == batch[:2] and out[3] is batch[2]
    assert out[2].__class__ is AggregateRun and (out[2].epoch, [a.count for a in out[2].aggregates]) == (1, [40])
    assert sorted(v[0] for v in table.values()) == [3, 7]  # not taken: their epochs run on
    assert stats.snapshot()["aggregate_records"] == 1  # records taken, for the bench's records per request


def test_exit_takes_everything_of_the_process_and_final_takes_all():
    table = FakeReqAgg()
    table.put(PID, LOOP, 3, LAUNCH, count=5)
    table.put(PID + 1, 9, 1, MEMCPY, count=2, nbytes=64)
    r = AggregateReader(table, Stats())
    gone = ProcExit(PID, 10)
    out = flat(r.merge(["x", gone]))
    assert [o.count for o in out if o.__class__ is CallAggregate] == [5] and out[-1] is gone
    out = flat(r.merge([], final=True))
    assert [(o.tgid, o.count, o.bytes) for o in out] == [(PID + 1, 2, 64)] and not table


def test_an_aggregate_whose_epoch_ended_in_an_earlier_batch_is_placed_first_and_counted_late():
    table, stats = FakeReqAgg(), Stats()
    r = AggregateReader(table, stats)
    r.merge([read(4)])
    table.put(PID, LOOP, 3, LAUNCH, count=2)  # a probe that read epoch 3 just before the bump
    out = flat(r.merge([write(5)]))
    assert out[0].__class__ is CallAggregate and out[1].epoch == 5
    assert stats.snapshot().get("aggregates_late") == 2


def agg(call, count, tid=LOOP, detail=0x1000, nbytes=0, duration=0, ctx=0, ts=5):
    return CallAggregate(PID, tid, 1, call, detail, ctx, count, nbytes, duration, ts, ts, ts + duration)


def run(*aggs) -> AggregateRun:
    a = aggs[0]
    return AggregateRun(a.tgid, a.tid, a.epoch, a.ctx, a.http_unseen, list(aggs))


def test_stitcher_adds_aggregates_to_the_request_exactly():
    s = Stitcher(span_budget=8, rng=random.Random(1))
    streamed = [calls.cuda(tid=LOOP, pid=PID, ts=3) for _ in range(5)]
    evs = [Accept(PID, LOOP, 1, FD, 3, "10.0.0.1", 5000), read(1, ts=2), *streamed,
           run(agg(LAUNCH, 37), agg(MEMCPY, 4, detail=1, nbytes=400), agg(SYNC, 3, detail=0, duration=30)),
           write(2, ts=100)]
    (req,) = [o for o in s.process(evs) if isinstance(o, Request)]
    sm = req.sink.summary
    assert (sm.launches, sm.calls, sm.memcpy_bytes["h2d"], sm.sync_ns) == (42, 49, 400, 30)
    assert len(req.sink.calls) == 5 and req.sink.rolled_up == 44
    assert req.sink.attributed == {"thread": 49} and s.attributed["thread"] == 49


def test_stitcher_splits_an_ambiguous_aggregate_by_count():
    s = Stitcher(span_budget=8, rng=random.Random(1))
    evs = [Accept(PID, 1, 1, FD, 3, None, None), Accept(PID, 2, 1, FD + 1, 3, None, None),
           read(1, ts=2, tid=1), read(2, ts=3, tid=2, fd=FD + 1),
           run(agg(LAUNCH, 10, tid=3))]  # a third thread, two requests open
    s.process(evs)
    reqs = s.procs[PID].open
    assert [r.sink.summary.ambiguous for r in reqs] == [5.0, 5.0]
    assert s.attributed["ambiguous"] == 10


def test_stitcher_holds_an_aggregate_in_a_context_until_its_request_binds():
    """uvicorn: the task's context is bound to its request at the response write; calls
    (and counts) made in it before are held, then land on the request as a task's."""
    s = Stitcher(span_budget=8, rng=random.Random(1))
    base, task = 0x5000, 0x7000
    evs = [Accept(PID, LOOP, 1, FD, 3, None, None), read(1, ts=2, ctx=base),
           ContextCopy(PID, LOOP, 3, task, base),
           calls.cuda(tid=LOOP, pid=PID, ts=4, ctx=task), run(agg(LAUNCH, 20, ctx=task, ts=5)),
           write(2, ts=9, ctx=task)]
    (req,) = [o for o in s.process(evs) if isinstance(o, Request)]
    assert req.sink.summary.launches == 21 and req.sink.attributed == {"task": 21}
    assert s.procs[PID].holds.held == 0


def test_the_map_is_read_only_when_the_kernel_counted_more_or_a_waiting_epoch_ended():
    table, counted = FakeReqAgg(), [0]
    r = AggregateReader(table, Stats(), counted=lambda: counted[0])
    table.put(PID, LOOP, 1, LAUNCH, count=4)
    counted[0] = 4
    assert r.merge([read(1)]) == [read(1)] and table.reads == 1  # epoch 1 runs on: left
    r.merge([read(1, pid=PID + 1)])  # another process's record, nothing new counted: no read
    assert table.reads == 1
    out = flat(r.merge([write(2)]))  # the waiting process's epoch ended: read and taken
    assert table.reads == 2 and [o.count for o in out if o.__class__ is CallAggregate] == [4]
    r.merge([read(3)])
    assert table.reads == 2  # nothing left, nothing new
    table.put(PID, LOOP, 3, LAUNCH, count=1)
    counted[0] = 5
    out = flat(r.merge([write(4)]))
    assert table.reads == 3 and [o.count for o in out if o.__class__ is CallAggregate] == [1]


def test_a_key_another_reader_deleted_is_not_reported():
    table = FakeReqAgg()
    table.put(PID, LOOP, 1, LAUNCH, count=4)
    r = AggregateReader(table, Stats())
    table.delete = lambda keys: [False] * len(keys)  # gone between the read and the delete
    assert r.merge([write(2)]) == [write(2)] and "aggregate_records" not in r.stats.snapshot()


def _place_by_scan(batch, aggs, before):
    """The placement rule, spelled as a scan (the reader bisects): first HTTP record of the
    process with a later epoch; -1 if its epoch ended before the batch; else the end."""
    out = []
    for a in aggs:
        last = before.get(a.tgid)
        if last is not None and epoch_after(last, a.epoch):
            out.append(-1)
            continue
        out.append(next((i for i, r in enumerate(batch) if r.tgid == a.tgid and epoch_after(r.epoch, a.epoch)),
                        len(batch)))
    return out


def test_placement_matches_the_scan_on_random_batches_with_epochs_out_of_order_and_wrapping():
    rng = random.Random(7)
    for trial in range(200):
        base = rng.choice([1, 0xFFFFFFF0, 1000])
        batch, epochs = [], {PID: base, PID + 1: base}
        for _ in range(rng.randrange(1, 60)):
            pid = rng.choice([PID, PID + 1])
            epochs[pid] = (epochs[pid] + rng.choice([1, 1, 2, 0])) & 0xFFFFFFFF or 1
            e = (epochs[pid] - rng.choice([0, 0, 0, 1])) & 0xFFFFFFFF or 1  # a record from another CPU, late
            batch.append(read(e, pid=pid) if rng.random() < 0.5 else write(e, pid=pid))
        before = {PID: (base - 1) & 0xFFFFFFFF} if trial % 2 else {}
        table, stats = FakeReqAgg(), Stats()
        aggs = []
        for n in range(rng.randrange(1, 20)):
            pid = rng.choice([PID, PID + 1])
            e = (base + rng.randrange(-2, 70)) & 0xFFFFFFFF or 1
            table.put(pid, LOOP, e, LAUNCH, count=1, ts=n)
            aggs.append(CallAggregate(pid, LOOP, e, LAUNCH, 0, 0, 1, 0, 0, n, n, n))
        r = AggregateReader(table, stats)
        r.epochs = dict(before)
        out = flat(r.merge(list(batch), final=True))
        want = _place_by_scan(batch, aggs, before)
        # Each aggregate's place: the number of batch records ahead of it in the output.
        got, seen = {}, 0
        for o in out:
            if o.__class__ is CallAggregate:
                got[o.ts_ns] = seen
            else:
                seen += 1
        assert [got[n] for n in range(len(aggs))] == [max(w, 0) for w in want], trial
        assert stats.snapshot().get("aggregates_late", 0) == sum(w < 0 for w in want)
        assert [o for o in out if o.__class__ is not CallAggregate] == batch


def test_a_context_copy_ends_an_epoch_so_a_reused_context_address_keeps_its_counts_apart():
    """FastAPI `def`: each request's endpoint runs on a worker thread in a copy of its
    task's context; the copy's address is the freed one of the request before. Counts made
    in the first incarnation are placed before the second copy, so they stay with the
    first request (they went to the second when only HTTP records ended epochs)."""
    base, task_a, task_b, copy, worker = 0x5000, 0x7000, 0x7100, 0x9000, 7
    table = FakeReqAgg()
    table.put(PID, worker, 5, LAUNCH, ctx=copy, count=3, ts=11)  # in request A's copy
    table.put(PID, worker, 6, LAUNCH, ctx=copy, count=5, ts=13)  # same address, request B's copy
    stream = [Accept(PID, LOOP, 1, FD, 3, None, None), Accept(PID, LOOP, 1, FD + 1, 3, None, None),
              read(1, ts=2, ctx=base), read(2, ts=3, ctx=base, fd=FD + 1),
              ContextCopy(PID, LOOP, 4, task_a, base, 3), ContextCopy(PID, LOOP, 5, task_b, base, 4),
              ContextCopy(PID, LOOP, 10, copy, task_a, 5), ContextCopy(PID, LOOP, 12, copy, task_b, 6),
              write(7, ts=20, ctx=task_a), write(8, ts=21, ctx=task_b, fd=FD + 1)]
    merged = AggregateReader(table, Stats()).merge(stream)
    counts = [o.count for o in flat(merged) if o.__class__ is CallAggregate]
    assert counts == [3, 5] and not table
    assert merged.index(stream[7]) == merged.index(next(o for o in merged if o.__class__ is AggregateRun)) + 1
    s = Stitcher(span_budget=8, rng=random.Random(1))
    done = sorted((o for o in s.process(merged) if isinstance(o, Request)), key=lambda r: r.start_ns)
    assert [r.sink.summary.launches for r in done] == [3, 5]
    assert [r.sink.attributed for r in done] == [{"task": 3}, {"task": 5}]


def test_counts_the_kernel_moved_past_leave_the_table_and_go_where_the_stream_ends_their_epoch():
    """A collector behind its load: the kernel is at epoch 9 while the stream has reached 0.
    The counts of epochs 1-8 leave the table at the next read (collect(), or any merge)
    after one that saw the kernel past them (an entry is read whole only once nothing adds
    to it), and wait here; each is placed in the batch whose record ends its epoch, as if
    read then."""
    table, stats, counted = FakeReqAgg(), Stats(), [10]
    table.put(PID, LOOP, 1, LAUNCH, count=4, ts=1)
    table.put(PID, LOOP, 3, LAUNCH, count=6, ts=3)
    table.put(PID, LOOP, 9, LAUNCH, count=2, ts=9)  # the epoch the kernel is in: counting still
    r = AggregateReader(table, stats, counted=lambda: counted[0], kernel_epoch=lambda tgid: 9)
    r.epochs[PID] = 0  # the stream has seen the process
    r.collect()
    assert len(table) == 3 and r.kept.n == 0  # the kernel's epoch read, after the table: for the next read
    counted[0] += 1
    r.collect()
    assert [v[0] for v in table.values()] == [2] and r.kept.n == 2
    table.put(PID, LOOP, 3, LAUNCH, count=1, ts=4)  # a call that landed after its entry was taken
    out = flat(r.merge([read(1), write(2)]))  # epoch 1 ends at the write
    assert [o.count if o.__class__ is CallAggregate else o.epoch for o in out] == [1, 4, 2]
    out = flat(r.merge([read(3), write(4)]))  # epoch 3 ends at the write: both of its counts
    assert [o.count if o.__class__ is CallAggregate else o.epoch for o in out] == [3, 6, 1, 4]
    assert r.kept.n == 0 and stats.snapshot()["aggregate_records"] == 3 and "aggregates_late" not in stats.snapshot()
    assert [(o.epoch, o.count) for o in flat(r.merge([], final=True)) if o.__class__ is CallAggregate] == [(9, 2)]


def test_kept_counts_are_bounded_and_the_rest_wait_in_the_table(monkeypatch):
    monkeypatch.setattr(reader_module, "MAX_KEPT", 2)
    table = FakeReqAgg()
    for e in (1, 2, 3, 4):
        table.put(PID, LOOP, e, LAUNCH, count=e, ts=e)
    r = AggregateReader(table, Stats(), kernel_epoch=lambda tgid: 9)
    r.epochs[PID] = 0
    r.collect()
    r.collect()
    assert r.kept.n == 2 and len(table) == 2
    out = flat(r.merge([write(e) for e in range(2, 6)]))
    assert [o.count if o.__class__ is CallAggregate else o.epoch for o in out] == [1, 2, 2, 3, 3, 4, 4, 5]
    assert r.kept.n == 0 and not table


def test_placement_is_the_same_with_counts_taken_ahead_of_the_stream():
    """Random streams read over several batches, counts made between them (some late: their
    epoch already ended in the stream), the kernel ahead of the stream: a reader that takes
    them as soon as the kernel moved past them, and collects between merges, puts every
    count where one that waits for the stream does, late ones included."""
    for trial in range(300):
        rng = random.Random(trial)
        epoch, stream, puts = 0, [], []
        for _ in range(rng.randrange(1, 6)):  # batches
            batch = []
            for _ in range(rng.randrange(0, 12)):
                epoch += rng.choice([1, 1, 2])
                batch.append(read(epoch) if rng.random() < 0.5 else write(epoch))
            made = [(rng.choice([PID, PID + 1]), max(1, epoch + rng.randrange(-3, 8))) for _ in range(rng.randrange(0, 6))]
            stream.append((batch, made))
        outs, lates = [], []
        for ahead in (False, True):
            table, stats, n = FakeReqAgg(), Stats(), 0
            r = AggregateReader(table, stats, kernel_epoch=(lambda tgid: epoch + 9) if ahead else None)
            out = []
            for batch, made in stream:
                for pid, e in made:
                    n += 1
                    table.put(pid, LOOP, e, LAUNCH, detail=n, count=1, ts=n)
                if ahead and rng.random() < 0.7:
                    r.collect()
                out += [(o.detail,) if o.__class__ is CallAggregate else o for o in flat(r.merge(list(batch)))]
            out += [(o.detail,) for o in flat(r.merge([], final=True))]
            outs.append(out)
            lates.append(stats.snapshot().get("aggregates_late", 0))
        assert outs[0] == outs[1] and lates[0] == lates[1], trial


def test_an_entry_is_never_taken_while_the_kernel_may_still_add_to_it():
    """The race a live test caught: the table read (109 launches counted in epoch 21), then
    the thread's last 34 launches added to that entry and its response moving the kernel's
    epoch on, all before the delete. An entry is taken early only once the kernel had moved
    past its epoch before the read began, so the 34 are never deleted unread."""
    kernel = [21]

    class Racing(FakeReqAgg):
        def packed(self):
            out = super().packed()
            if kernel[0] == 21:  # after the read: the kernel goes on
                (key,) = list(self)
                count, *rest = self[key]
                self[key] = (count + 34, *rest)
                kernel[0] = 25
            return out

    table = Racing()
    table.put(PID, LOOP, 21, LAUNCH, count=109)
    r = AggregateReader(table, Stats(), kernel_epoch=lambda tgid: kernel[0])
    r.epochs[PID] = 20
    r.collect()
    r.collect()
    out = flat(r.merge([write(22)]))
    assert [o.count for o in out if o.__class__ is CallAggregate] == [143] and not table


def test_a_collector_far_behind_keeps_nothing_more_and_leaves_counts_to_the_kernel():
    """With the ring buffer half full the collector is past its load: counts wait in req_agg
    (and are shed there when it fills) rather than cost the pipeline the ring's room."""
    table = FakeReqAgg()
    for e in (1, 2):
        table.put(PID, LOOP, e, LAUNCH, count=e, ts=e)
    r = AggregateReader(table, Stats(), kernel_epoch=lambda tgid: 9)
    r.epochs[PID] = 0
    r.shedding = True
    r.collect()
    r.collect()
    assert r.kept.n == 0 and len(table) == 2
    r.shedding = False
    r.collect()
    assert r.kept.n == 2 and not table


def test_forgetting_a_process_drops_what_was_kept_for_it():
    table = FakeReqAgg()
    table.put(PID, LOOP, 1, LAUNCH, count=3, ts=1)
    table.put(PID + 1, LOOP, 1, LAUNCH, count=4, ts=1)
    r = AggregateReader(table, Stats(), kernel_epoch=lambda tgid: 9)
    r.epochs.update({PID: 0, PID + 1: 0})
    r.collect()
    r.collect()
    assert r.kept.n == 2
    r.forget({PID})
    assert r.kept.n == 1 and PID not in r.epochs
    assert [(o.tgid, o.count) for o in flat(r.merge([], final=True)) if o.__class__ is CallAggregate] == [(PID + 1, 4)]


def test_a_row_becomes_its_record_field_by_field_the_unseen_flag_out_of_the_call():
    from otel_gpu.kernel_io.abi import AGG_HTTP_UNSEEN
    table = FakeReqAgg()
    table[_Entry((PID, 7, 3, MEMCPY, 2, 0xC7))] = (5, 4096, 11, 100, 140, 151)
    table[_Entry((PID, 8, 3, MEMCPY | AGG_HTTP_UNSEEN, 1, 0))] = (1, 64, 2, 120, 120, 122)
    got = sorted(flat(AggregateReader(table, Stats()).merge([], final=True)), key=lambda a: a.tid)
    assert got == [CallAggregate(PID, 7, 3, MEMCPY, 2, 0xC7, 5, 4096, 11, 100, 140, 151),
                   CallAggregate(PID, 8, 3, MEMCPY, 1, 0, 1, 64, 2, 120, 120, 122, http_unseen=True)]
