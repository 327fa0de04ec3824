"""What vradix does to one live SGLang scheduler, for the hooks: which requests it holds (`requests`) and one
publication across every step (`publication`: epoch bump, L3 prefetch revocation, P/D promise revocation,
weight-derived caches, guard audit, metrics). Hooks call these; nothing here names a hook target."""
