"""Print a pip constraints file derived from the installed sglang's own metadata (Requires-Dist pins).

Every `==`, `<`, `<=`, `>=`, `~=` requirement sglang declares (without extras/markers that exclude this platform)
becomes a constraint, so a later unconstrained resolve can never swap torch or drift transformers/openai.
"""
from importlib.metadata import distribution

from packaging.requirements import Requirement

def main() -> None:
    dist = distribution("sglang")
    seen = {}
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        if not req.specifier:
            continue
        seen[req.name.lower()] = f"{req.name}{req.specifier}"
    print(f"# derived from sglang=={dist.version} METADATA")
    for name in sorted(seen):
        print(seen[name])

if __name__ == "__main__":
    main()
