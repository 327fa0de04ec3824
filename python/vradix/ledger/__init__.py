"""The KV page ledger: which weight epoch wrote each KV page, on the device (`device`) and in the HiCache host pool
(`host`), and the checks that read it (`guard`: the verify guard, the backstop, the audit)."""
