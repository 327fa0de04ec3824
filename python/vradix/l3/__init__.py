"""HiCache L3 (storage) tools: which weight identity wrote which page (`manifest`), and garbage collection of the
pages of identities that are no longer live (`gc`; command line: `python -m vradix.l3 gc --help`)."""
