"""The trainer's side: per-token weight versions read from a finished response (native `/generate` or OpenAI), and
the corrections RL trainers apply with them (a mask, truncated importance weights).

Client-side only: nothing here imports SGLang or the serving package; numpy and torch are optional.
"""
