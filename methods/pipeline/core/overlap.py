"""Overlap of computation and communication: a communication thread that completes pre-posted receives in the
background and clocks their arrival, and the per-stage accounting of compute, communication and hidden time."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from harness.schedule.ir import COMPUTE, RECEIVES, SENDS, Message, message_key
from harness.trace import parse_events


class ArrivalWatch:
    """One communication thread per incoming stream: it waits for each receive posted on the stream (in order, as
    one tag delivers them), notes when its data arrived, and wakes the compute thread once it reaches that receive.
    The compute thread never blocks in the transport; torch releases the GIL while a thread waits."""

    def __init__(self) -> None:
        self._queues: dict[Hashable, queue.Queue] = {}
        self._threads: list[threading.Thread] = []
        self._done: dict[Message, threading.Event] = {}
        self._errors: dict[Message, BaseException] = {}
        self.arrivals: dict[Message, float] = {}

    def watch(self, stream: Hashable, message: Message, work: dist.Work) -> None:
        done = self._done[message] = threading.Event()
        if stream not in self._queues:
            self._queues[stream] = queue.Queue()
            thread = threading.Thread(target=self._serve, args=(self._queues[stream],), daemon=True,
                                      name=f"apapo-comm-{len(self._threads)}")
            thread.start()
            self._threads.append(thread)
        self._queues[stream].put((message, work, done))

    def _serve(self, pending: queue.Queue) -> None:
        while (item := pending.get()) is not None:
            message, work, done = item
            try:
                work.wait()
            except BaseException as exc:  # noqa: BLE001 - handed to the compute thread, which raises it
                self._errors[message] = exc
            # Let go of the receive (its Work holds the buffer) before the compute thread wakes: the buffer's last
            # reference is then the compute thread's, which frees it where the allocator meter sees it (held until
            # the next item, it was freed here, unseen: one message a step counted as held for ever).
            item = work = None
            self.arrivals[message] = time.perf_counter()
            done.set()

    def wait(self, message: Message) -> None:
        """Block until `message` has arrived (re-raising the transport's error, if any)."""
        self._done.pop(message).wait()
        if message in self._errors:
            raise self._errors.pop(message)

    def take(self) -> dict[Message, float]:
        """The arrival times noted since the last call."""
        taken, self.arrivals = self.arrivals, {}
        return taken

    def close(self) -> None:
        for pending in self._queues.values():
            pending.put(None)
        for thread in self._threads:
            thread.join(timeout=10)


def overlap_summary(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per stage, over the traced steps: compute_s (forwards, backwards, updates), comm_s (for each message the stage
    received: from its send's start on the sender to its arrival here, both on the host's one clock), exposed_s (the
    part of comm_s the stage spent waiting in the receive, plus the time its sends blocked) and hidden_s: the part
    of each received message's flight during which neither end waited on it (neither the receiver in its receive
    nor the sender in its send, e.g. gloo's send blocking until the receive is posted): communication that ran
    while both stages computed. A receive without a noted arrival (a blocking one) arrived when its wait ended.
    hidden_share = sum hidden / sum comm.

    records: metrics.jsonl records, `trace` ones ({step, worker, events}) and `arrivals` ones ({step, worker,
    messages: [[kind, stage, iteration, mb, time], ...]}). Messages are told apart by (kind, stage, iteration, mb),
    unique in a run of apapo (global microbatch numbers)."""
    sends: dict[Message, tuple[float, float]] = {}  # (start, end) of the send
    receives: list[tuple[int, Message, float, float]] = []  # (stage, message, wait start, wait end)
    arrivals: dict[Message, float] = {}
    stages: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for record in records:
        if record.get("kind") == "arrivals":
            for kind, stage, iteration, mb, at in record.get("messages", []):
                arrivals[(kind, int(stage), int(iteration), int(mb))] = float(at)
        if record.get("kind") != "trace":
            continue
        for e in parse_events(record.get("events")):
            row = stages[e.stage]
            if e.op in COMPUTE:
                row["compute_s"] += e.duration
            elif e.op in SENDS:
                sends[message_key(e.op, e.stage, e.iteration, e.mb)] = (e.start, e.end)
                row["send_blocked_s"] += e.duration
            elif e.op in RECEIVES:
                receives.append((e.stage, message_key(e.op, e.stage, e.iteration, e.mb), e.start, e.end))
    for stage, message, wait_start, wait_end in receives:
        if message not in sends:  # sent in an untraced step: not counted
            continue
        sent, send_end = sends[message]
        arrived = max(arrivals.get(message, wait_end), sent)
        waited = max(0.0, min(wait_end, arrived) - max(wait_start, sent))
        row = stages[stage]
        row["comm_s"] += arrived - sent
        row["waited_s"] += waited
        row["unhidden_s"] += _covered(sent, arrived, [(wait_start, wait_end), (sent, send_end)])
        row["messages"] += 1
    out = []
    for stage in sorted(stages):
        row = stages[stage]
        comm, waited = row["comm_s"], row["waited_s"]
        out.append({"stage": stage, "compute_s": row["compute_s"], "comm_s": comm,
                    "exposed_s": waited + row["send_blocked_s"], "hidden_s": max(0.0, comm - row["unhidden_s"]),
                    "messages": int(row["messages"])})
    comm = sum(r["comm_s"] for r in out)
    return {"stages": out, "comm_s": comm, "exposed_s": sum(r["exposed_s"] for r in out),
            "hidden_share": sum(r["hidden_s"] for r in out) / comm if comm > 0 else None}


def _covered(start: float, end: float, intervals: list[tuple[float, float]]) -> float:
    """The length of [start, end] that the union of `intervals` covers."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start))
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def read_records(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records, skipping lines a killed writer left half-written."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
