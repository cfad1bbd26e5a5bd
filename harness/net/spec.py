"""The emulated network as a value: rate and latency, their parsing, and the short --network form."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_TIME = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_rate(text: str) -> int | None:
    """'100mbit' -> 100_000_000 bit/s (tc's units: bit, kbit, mbit, gbit; powers of 1000); 'unlimited' -> None."""
    value = text.strip().lower()
    if value == "unlimited":
        return None
    match = _RATE.match(value)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"rate {text!r}: give a positive number with a unit bit, kbit, mbit or gbit "
                         f"(e.g. 100mbit, 1gbit), or 'unlimited'")
    return round(float(match.group(1)) * _RATE_UNITS[match.group(2)])


def parse_latency(text: str) -> float:
    """'1ms' -> 0.001 s (units us, ms, s); '0' or '0ms' -> 0."""
    value = text.strip().lower()
    if value == "0":
        return 0.0
    match = _TIME.match(value)
    if not match:
        raise ValueError(f"latency {text!r}: give a number with a unit us, ms or s (e.g. 1ms, 500us)")
    return float(match.group(1)) * _TIME_UNITS[match.group(2)]


class NetworkSpec(BaseModel):
    """An emulated network: every rank's link limited to `rate` in each direction, and `latency` one way between
    two ranks. Written to spec.json and manifest.json; `text` is its short form (the --network syntax)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: str = "unlimited"
    latency: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: object) -> object:
        """Accept the short form too: '100mbit,latency=1ms' (a suite's `network = "..."`)."""
        return _text_fields(data) if isinstance(data, str) else data

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        parse_rate(value)
        return value.strip().lower()

    @field_validator("latency")
    @classmethod
    def _latency(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return None if parse_latency(value) == 0 else value.strip().lower()

    @property
    def rate_bps(self) -> int | None:
        """Bits per second of each link in each direction; None when unlimited."""
        return parse_rate(self.rate)

    @property
    def latency_s(self) -> float:
        """One-way delay between two ranks in seconds (0 without a latency)."""
        return parse_latency(self.latency) if self.latency else 0.0

    @property
    def text(self) -> str:
        """'100mbit' or '100mbit,latency=1ms': the --network form, which `parse_network` reads back."""
        return self.rate + (f",latency={self.latency}" if self.latency else "")


def _text_fields(text: str) -> dict[str, str]:
    """'100mbit,latency=1ms' -> {'rate': '100mbit', 'latency': '1ms'}; ValueError on an unknown option."""
    rate, *options = [part.strip() for part in text.split(",")]
    fields: dict[str, str] = {"rate": rate}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key.strip() != "latency":
            raise ValueError(f"network {text!r}: unknown option {option!r} (the form is RATE[,latency=TIME], "
                             f"e.g. 100mbit,latency=1ms)")
        fields["latency"] = value.strip()
    return fields


def parse_network(text: str) -> NetworkSpec:
    """The --network form -> NetworkSpec: 'RATE[,latency=TIME]', e.g. '1gbit', 'unlimited', '100mbit,latency=1ms'.

    Raises ValueError with one line saying what is wrong.
    """
    fields = _text_fields(text)
    try:
        parse_rate(fields["rate"])
        if "latency" in fields:
            parse_latency(fields["latency"])
    except ValueError as exc:
        raise ValueError(f"network {text!r}: {exc}") from None
    return NetworkSpec(**fields)
