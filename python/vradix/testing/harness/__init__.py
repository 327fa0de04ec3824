"""Test and benchmark harnesses: real CPU servers (`server`), P/D pairs behind the real router (`pd`), HTTP clients,
cache fixtures on SGLang's real UnifiedRadixCache, HiCache stores and the shared scenarios. Never imported by the
product."""
