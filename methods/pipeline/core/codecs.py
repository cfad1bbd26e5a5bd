"""Wire codecs for the tensors pipeline stages send each other: a fixed payload layout per shape, bytes as sent."""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import torch

from methods.bits import pack_bits, unpack_bits

_SCALE_BYTES = 4  # one fp32 scale per message


class Codec(abc.ABC):
    """encode(tensor) -> a flat uint8 payload of exactly nbytes(numel) bytes; decode(payload, shape) -> fp32 tensor.

    The payload size depends only on the number of elements, so every receive can be posted ahead with a buffer of
    the right size. `error_bound(tensor)` is the largest absolute error one element may have after a round trip
    (0 for lossless codecs). A codec with state (error feedback) keeps it per `stream` and exposes it through
    state_dict; the codecs here are stateless.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def nbytes(self, numel: int) -> int:
        """Payload bytes of a tensor of `numel` elements."""

    @abc.abstractmethod
    def encode(self, tensor: torch.Tensor, stream: Any = None) -> torch.Tensor:
        """A flat uint8 payload of nbytes(tensor.numel()) bytes."""

    @abc.abstractmethod
    def decode(self, payload: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The fp32 tensor of `shape` that `payload` encodes."""

    def error_bound(self, tensor: torch.Tensor) -> float:
        return 0.0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class Cast(Codec):
    """The tensor cast to `dtype`: the payload is its bytes (no copy for a contiguous fp32 tensor sent as fp32)."""

    dtype: ClassVar[torch.dtype]

    def nbytes(self, numel: int) -> int:
        return self.dtype.itemsize * numel

    def encode(self, tensor: torch.Tensor, stream: Any = None) -> torch.Tensor:
        return tensor.detach().to(self.dtype).contiguous().view(-1).view(torch.uint8)

    def decode(self, payload: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return payload.view(self.dtype).view(shape).float()


class Plain(Cast):
    """fp32 as it is."""

    name = "none"
    dtype = torch.float32


class Half(Cast):
    """fp16: half the bytes; relative error at most 2^-11 per element within fp16's range (|x| < 65504)."""

    name = "fp16"
    dtype = torch.float16

    def error_bound(self, tensor: torch.Tensor) -> float:
        return float(tensor.abs().max()) * 2.0**-11 if tensor.numel() else 0.0


class Linear(Codec):
    """Symmetric linear quantization with one fp32 scale per message: s = max|x|, code q = round(x / s · L) in
    [-L, L] with L = 2^(bits-1) - 1 (round half to even: deterministic), sent as q + L in `bits`-wide unsigned codes
    packed 8/bits per byte after the scale. Decoded as q · s / L, so each element is within s / (2L) of its value:
    s/254 for int8, s/14 for int4."""

    bits: ClassVar[int]

    @property
    def levels(self) -> int:
        return 2 ** (self.bits - 1) - 1

    def nbytes(self, numel: int) -> int:
        return _SCALE_BYTES + math.ceil(numel * self.bits / 8)

    def encode(self, tensor: torch.Tensor, stream: Any = None) -> torch.Tensor:
        x = tensor.detach().float().reshape(-1)
        scale = x.abs().max() if x.numel() else torch.zeros(())
        if scale > 0:
            codes = torch.round(x * (self.levels / scale)).clamp_(-self.levels, self.levels)
        else:
            codes = torch.zeros_like(x)
        packed = pack_bits((codes + self.levels).to(torch.uint8), self.bits)
        return torch.cat([scale.float().reshape(1).view(torch.uint8), packed])

    def decode(self, payload: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        scale = payload[:_SCALE_BYTES].clone().view(torch.float32)
        numel = math.prod(shape)
        codes = unpack_bits(payload[_SCALE_BYTES:], self.bits, numel).float() - self.levels
        return (codes * (scale / self.levels)).view(shape)

    def error_bound(self, tensor: torch.Tensor) -> float:
        return float(tensor.abs().max()) / (2 * self.levels) if tensor.numel() else 0.0


class Int8(Linear):
    name = "int8"
    bits = 8


class Int4(Linear):
    name = "int4"
    bits = 4


#: The codecs every pipeline method offers as `activation_codec` and `gradient_codec`.
CODECS: dict[str, type[Codec]] = {c.name: c for c in (Plain, Half, Int8, Int4)}


def make_codec(name: str) -> Codec:
    try:
        return CODECS[name]()
    except KeyError:
        raise ValueError(f"unknown codec {name!r} (known: {', '.join(CODECS)})") from None
