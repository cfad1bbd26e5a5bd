"""The train record's direct formatting (MetricsWriter.write_train, the Loop's every step) writes the very line that
the general write() writes, for every kind of value, and falls back to it where it cannot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from harness.run.records import TRAIN_KEYS, MetricsWriter


class FixedClock:
    """A clock that reads the same every time, so that two writes of one record are comparable byte for byte."""

    def __init__(self, wall: float, train: float):
        self._wall, self._train = wall, train

    def wall(self) -> float:
        return self._wall

    def train(self) -> float:
        return self._train


def counted(write, calls: list):
    """`write`, noting each call in `calls`."""
    def wrapped(*args, **kwargs):
        calls.append(True)
        return write(*args, **kwargs)
    return wrapped


def both_lines(tmp_path, rank, clock, *args) -> tuple[str, str, bool]:
    """(write_train's line, write("train", ...)'s line, whether write_train formatted it itself) for the same
    record; a TypeError's message in place of a line."""
    step, epoch, samples, loss, lr, sent, recv, categories, extra = args
    lines, general = [], []
    for index, direct in enumerate((True, False)):
        path = tmp_path / f"m{index}.jsonl"
        path.unlink(missing_ok=True)
        writer = MetricsWriter(path, rank, clock)
        writer.write = counted(writer.write, general)
        try:
            if direct:
                writer.write_train(step, epoch, samples, loss, lr, sent, recv, categories, extra)
            else:
                writer.write("train", step=step, epoch=epoch, samples=samples, loss=loss, lr=lr, bytes_sent=sent,
                             bytes_recv=recv, bytes_by_category=categories, **extra)
        except TypeError as error:
            lines.append(f"TypeError: {error}")
        else:
            lines.append(path.read_text())
        finally:
            writer.close()
    event("through write()" if len(general) == 2 else "formatted directly")
    return lines[0], lines[1], len(general) == 1


FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e6, 1e6).map(np.float64),
                   st.integers(-10, 10), st.booleans())
INTS = st.one_of(st.integers(0, 10**12), st.integers(0, 10).map(np.int64), st.booleans(), st.just(3.0))
KEYS = st.one_of(st.sampled_from(["gradients", "control", "activation_grads", "params"]), st.text(max_size=6))
JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=6)
EXTRA_KEYS = st.one_of(st.sampled_from(["busy_s", "wait_s", "span_s", "rank", "wall_time_s", "kind"]),
                       st.text(max_size=6))


PLAIN_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
PLAIN_INTS = st.integers(0, 10**15)
PLAIN_KEYS = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
JSON_PLAIN = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), PLAIN_FLOATS, st.text(max_size=5)),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3), max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(rank=st.integers(0, 7), wall=st.floats(0, 1e6), train=st.floats(0, 1e6), step=PLAIN_INTS,
       epoch=PLAIN_FLOATS, samples=PLAIN_INTS, loss=st.one_of(st.none(), PLAIN_FLOATS), lr=PLAIN_FLOATS,
       sent=PLAIN_INTS, recv=PLAIN_INTS,
       categories=st.dictionaries(PLAIN_KEYS, st.lists(PLAIN_INTS, min_size=2, max_size=2), max_size=5),
       extra=st.dictionaries(PLAIN_KEYS.filter(lambda k: k not in TRAIN_KEYS), JSON_PLAIN, max_size=3))
def test_a_plain_record_is_formatted_directly_as_the_general_writer_writes_it(
        tmp_path_factory, rank, wall, train, step, epoch, samples, loss, lr, sent, recv, categories, extra):
    tmp_path = tmp_path_factory.mktemp("lines")
    direct, general, formatted = both_lines(tmp_path, rank, FixedClock(wall, train), step, epoch, samples, loss, lr,
                                            sent, recv, categories, extra)
    assert formatted and direct == general


@settings(max_examples=300, deadline=None)
@given(rank=st.one_of(st.integers(0, 7), st.just(np.int64(1))), wall=st.floats(0, 1e5), train=st.floats(0, 1e5),
       step=INTS, epoch=FLOATS, samples=INTS, loss=st.one_of(st.none(), FLOATS), lr=FLOATS, sent=INTS, recv=INTS,
       categories=st.dictionaries(KEYS, st.one_of(st.lists(INTS, min_size=2, max_size=2),
                                                  st.tuples(INTS, INTS)), max_size=4),
       extra=st.dictionaries(EXTRA_KEYS, JSON_VALUES, max_size=3))
def test_any_other_record_is_the_general_writers_line(tmp_path_factory, rank, wall, train, step, epoch, samples,
                                                      loss, lr, sent, recv, categories, extra):
    tmp_path = tmp_path_factory.mktemp("lines")
    direct, general, _ = both_lines(tmp_path, rank, FixedClock(wall, train), step, epoch, samples, loss, lr, sent,
                                    recv, categories, extra)
    assert direct == general


def test_a_plain_record_is_formatted_directly_and_reads_back(tmp_path, monkeypatch):
    writer = MetricsWriter(tmp_path / "m.jsonl", 1, FixedClock(12.3456789, 10.5))
    monkeypatch.setattr(writer, "write", lambda *a, **k: pytest.fail("the plain record went through write()"))
    writer.write_train(40, 0.9090909090909091, 1280, 0.123, 0.05, 10, 12,
                       {"gradients": [10, 12], "control": [96, 96]}, {"busy_s": 0.5})
    writer.write_train(41, 1.0, 1312, None, 0.05, 10, 12, {}, {})
    writer.close()
    first, second = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert first == {"kind": "train", "rank": 1, "wall_time_s": 12.345679, "train_time_s": 10.5, "step": 40,
                     "epoch": 0.9090909090909091, "samples": 1280, "loss": 0.123, "lr": 0.05, "bytes_sent": 10,
                     "bytes_recv": 12, "bytes_by_category": {"gradients": [10, 12], "control": [96, 96]},
                     "busy_s": 0.5}
    assert second["loss"] is None and second["bytes_by_category"] == {}


def test_a_nonfinite_loss_goes_through_write_and_stays_valid_json(tmp_path):
    writer = MetricsWriter(tmp_path / "m.jsonl", 0, FixedClock(1.0, 1.0))
    writer.write_train(3, 0.1, 96, math.nan, 0.05, 0, 0, {}, {"busy_s": math.inf})
    writer.close()
    record = json.loads((tmp_path / "m.jsonl").read_text())
    assert record["loss"] == "nan" and record["busy_s"] == "inf"
