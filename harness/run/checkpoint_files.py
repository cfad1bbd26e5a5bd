"""A run's checkpoint files: each with a sha256 sidecar, the last two kept, and the choice of one on resume.

Layout (rank 0 writes it; docs/results.md): `checkpoint.pt`, the newest checkpoint, and `checkpoint.prev.pt`, the one
before, each a plain torch.save file (harness/run/checkpoint.py) next to a sidecar `<file>.json`:
`{"format", "sha256", "bytes", "spec_sha256", "step", "metrics_bytes", "written"}`. `sha256` and `bytes` are the
.pt file's; `spec_sha256` is spec_hash() of the resolved RunSpec the checkpoint belongs to (the spec.json the suite
compares on --resume). A file is valid when its sidecar exists and its size, sha256 and spec hash match.

write() rotates and writes in an order that leaves at least one valid checkpoint on disk at every instant once one
exists, so a kill -9 at any point of a write leaves the previous one (or the new one) usable. choose() verifies the
files newest first; quarantine() renames the rejected ones to `<file>.rejected`, so a rotation never moves a damaged
file over a good one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.run import checkpoint
from harness.run.records import utc_now

CURRENT = checkpoint.CHECKPOINT_FILE  # checkpoint.pt
PREVIOUS = "checkpoint.prev.pt"
NAMES = (CURRENT, PREVIOUS)  # newest first
SIDECAR_FORMAT = 1
REJECTED_SUFFIX = ".rejected"
_CHUNK = 1 << 20


def spec_hash(spec_json: str) -> str:
    """sha256 (hex) of a RunSpec's model_dump_json(): equal specs (RunSpec ==, as suite.resumable compares) give
    equal text, and so equal hashes."""
    return hashlib.sha256(spec_json.encode()).hexdigest()


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _tmp(run_dir: Path, name: str) -> Path:
    return run_dir / f".{name}.{os.getpid()}.tmp"


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = _tmp(path.parent, path.name)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # e.g. a full disk: no half-written temp file is left behind
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    """Make the renames in `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(run_dir: Path, state: dict[str, Any], spec_sha256: str) -> dict[str, Any]:
    """Write `state` as the new checkpoint.pt, the current one becoming checkpoint.prev.pt. Returns the sidecar.

    The order, with A the current checkpoint and B the new one (a file is valid while its sidecar matches it):
    B to a temp file and fsync; prev's sidecar := A's (prev.pt still old: invalid, A valid); rename checkpoint.pt to
    checkpoint.prev.pt (prev = A valid); rename the temp file to checkpoint.pt (B with A's sidecar: invalid, prev
    valid); checkpoint.pt's sidecar := B's (both valid). Every step is one atomic rename.
    A checkpoint.pt without a sidecar is not rotated (it cannot be verified; the previous one stays) but replaced.
    """
    current, previous = run_dir / CURRENT, run_dir / PREVIOUS
    tmp = _tmp(run_dir, CURRENT)
    try:
        checkpoint.write_file(tmp, state)
        meta = {"format": SIDECAR_FORMAT, "sha256": file_sha256(tmp), "bytes": tmp.stat().st_size,
                "spec_sha256": spec_sha256, "step": int(state["step"]),
                "metrics_bytes": int(state["metrics_bytes"]), "written": utc_now()}
        if current.exists() and sidecar(current).exists():
            _write_bytes_atomic(sidecar(previous), sidecar(current).read_bytes())
            os.replace(current, previous)
        os.replace(tmp, current)
    except BaseException:  # e.g. a full disk: the checkpoints on disk stay valid, and no temp file is left
        tmp.unlink(missing_ok=True)
        raise
    _write_bytes_atomic(sidecar(current), (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    _fsync_dir(run_dir)
    return meta


class Rejected(Exception):
    """A checkpoint file that failed verification; the message is the reason."""


@dataclass
class Choice:
    """What a resume continues from: `file` (a name in NAMES, or None: start over at step 0), its `step` and
    `sha256`, the files `rejected` on the way ([{file, reason}]), and with choose(load=True) the loaded checkpoint."""

    file: str | None
    step: int = 0
    sha256: str | None = None
    rejected: list[dict[str, str]] = field(default_factory=list)
    saved: dict[str, Any] | None = None

    @property
    def found_files(self) -> bool:
        """Whether any checkpoint file was there (a run's first start has none: nothing to report)."""
        return self.file is not None or bool(self.rejected)

    def record(self) -> dict[str, Any]:
        """The `resume` field of status.json and manifest.json."""
        return {"from": self.file, "step": self.step, "rejected": list(self.rejected)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Choice:
        """The choice a `resume` record (record()) describes, without its file's hash or contents."""
        return cls(record.get("from"), int(record.get("step") or 0), None, list(record.get("rejected") or []))

    def describe(self) -> str:
        """One line for the console and the rank log."""
        if self.file is not None and not self.rejected:
            return f"resuming from its {self.file} at step {self.step}"
        reasons = "; ".join(f"{r['file']}: {r['reason']}" for r in self.rejected)
        if self.file is not None:
            return f"rejected {reasons}; resuming from {self.file} at step {self.step}"
        return f"no valid checkpoint ({reasons}); restarting from step 0"


def present(run_dir: Path) -> bool:
    """Whether run_dir holds any checkpoint file or sidecar."""
    return any((run_dir / name).exists() or sidecar(run_dir / name).exists() for name in NAMES)


def choose(run_dir: Path, spec_sha256: str, load: bool = False) -> Choice:
    """The newest valid checkpoint of run_dir for the spec with this hash, and why newer ones were rejected.

    With `load`, the chosen file is read once, verified from those bytes and loaded (weights_only); a file that
    verifies but does not load, or whose own `spec` does not hash to `spec_sha256`, is rejected too. Changes nothing
    on disk (see quarantine()).
    """
    rejected: list[dict[str, str]] = []
    for name in NAMES:
        path = run_dir / name
        if not path.exists() and not sidecar(path).exists():
            continue
        try:
            meta, saved = _verify(path, spec_sha256, load)
        except Rejected as exc:
            rejected.append({"file": name, "reason": str(exc)})
            continue
        return Choice(name, meta["step"], meta["sha256"], rejected, saved)
    return Choice(None, 0, None, rejected, None)


def _verify(path: Path, spec_sha256: str, load: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    side = sidecar(path)
    if not path.exists():
        raise Rejected(f"missing, only its sidecar {side.name} is there (a write was interrupted)")
    if not side.exists():
        raise Rejected(f"no sidecar {side.name} (written by an interrupted write or an older dtbench)")
    try:
        meta = json.loads(side.read_text())
        expected = {key: meta[key] for key in ("sha256", "bytes", "spec_sha256", "step")}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Rejected(f"unreadable sidecar {side.name} ({type(exc).__name__}: {exc})") from None
    if not (isinstance(expected["sha256"], str) and isinstance(expected["spec_sha256"], str)
            and all(isinstance(expected[k], int) and not isinstance(expected[k], bool) for k in ("bytes", "step"))):
        raise Rejected(f"unreadable sidecar {side.name} (mistyped fields)")
    if meta.get("format") != SIDECAR_FORMAT:
        raise Rejected(f"sidecar format {meta.get('format')!r}, this dtbench reads {SIDECAR_FORMAT}")
    if expected["spec_sha256"] != spec_sha256:
        raise Rejected(f"spec hash mismatch: written for spec {str(expected['spec_sha256'])[:12]}, this run's is "
                       f"{spec_sha256[:12]}")
    size = path.stat().st_size
    if size != expected["bytes"]:
        what = "truncated" if size < expected["bytes"] else "size mismatch"
        raise Rejected(f"{what}: {size} bytes, its sidecar says {expected['bytes']}")
    data = path.read_bytes() if load else None
    digest = hashlib.sha256(data).hexdigest() if data is not None else file_sha256(path)
    if digest != expected["sha256"]:
        raise Rejected("sha256 mismatch")
    if data is None:
        return meta, None
    try:
        saved = checkpoint.loads(data, path)
    except Exception as exc:  # noqa: BLE001 - whatever a verified file fails to load with is the reason
        raise Rejected(f"does not load ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    if spec_hash(str(saved.get("spec"))) != spec_sha256 or saved.get("step") != expected["step"]:
        raise Rejected("its contents disagree with its sidecar (spec or step)")
    return meta, saved


def load_verified(path: Path, sha256: str) -> dict[str, Any]:
    """Load a checkpoint another rank chose, checking its bytes against the sha256 that rank verified."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{path}: sha256 differs from the one rank 0 verified (the file changed, or the "
                           "filesystem returned other bytes)")
    return checkpoint.loads(data, path)


def quarantine(run_dir: Path, choice: Choice) -> None:
    """Rename every rejected file and its sidecar to `<name>.rejected` (replacing an older one), and remove the temp
    files of interrupted writes, so that only valid checkpoints keep checkpoint*.pt names."""
    for entry in choice.rejected:
        path = run_dir / entry["file"]
        for p in (path, sidecar(path)):
            if p.exists():
                os.replace(p, p.with_name(p.name + REJECTED_SUFFIX))
    for name in NAMES:
        for tmp in run_dir.glob(f".{name}*.tmp"):
            tmp.unlink(missing_ok=True)
    _fsync_dir(run_dir)
