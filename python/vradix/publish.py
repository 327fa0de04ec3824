"""`python -m vradix.publish`: publish weights from disk to one or more SGLang engines, fail closed.

    python -m vradix.publish --url http://h1:30000 --url http://h2:30000 --model-path /ckpt/step_42 --version step42
    python -m vradix.publish --gateway http://smg:30000 --model-path /ckpt/step_42 --version step42

`--gateway` is an SGLang model gateway started with `--enable-rl`: every worker it routes to is published through it
and verified (see `vradix.client`).

Exit status 0 when every engine verified the publication: one JSON line per engine on stdout, then the fleet line
`{"fleet": {"weight_id": ..., "mode": ..., "engines": [...]}}`, the one weight identity every engine in a proven or
declared identity mode serves (null when none is; `nonce` and stock engines are listed with `"in_fleet": false`).
2 when the publication failed verification, engines that must agree on one identity disagreeing included (the
evidence and the state each engine was left in go to stderr), 1 on bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from vradix.client import PublishError, publish
from vradix.predicate import UnsafeDeployment


def main(argv=None, prog: str = "python -m vradix.publish") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--url", action="append", default=[], help="engine base URL (repeat for several engines)")
    p.add_argument("--gateway", action="append", default=[],
                   help="SGLang model gateway (smg --enable-rl) base URL: publish to every worker behind it")
    p.add_argument("--model-path", required=True, help="weights to load with /update_weights_from_disk")
    p.add_argument("--version", help="weight_version label to publish (default: a fresh unique label)")
    p.add_argument("--colocated", action="store_true", help="engines share GPUs with the trainer")
    p.add_argument("--prefer-sharing", action="store_true",
                   help="engines without vradix: retract + flush to keep prefix sharing on")
    p.add_argument("--pause-mode", choices=("in_place", "retract"), help="override the derived pause mode")
    p.add_argument("--on-failure", choices=("stay_paused", "continue"), default="stay_paused")
    p.add_argument("--timeout", type=float, default=600.0, help="per HTTP call, seconds")
    p.add_argument("--api-key", default=os.environ.get("VRADIX_API_KEY") or None,
                   help="API key for servers (and gateways) that require one (default: $VRADIX_API_KEY)")
    args = p.parse_args(argv)
    if not args.url and not args.gateway:
        p.error("give at least one --url or --gateway")
    try:
        results = publish(args.url, args.model_path, args.version, colocated=args.colocated,
                          prefer_sharing=args.prefer_sharing, pause_mode=args.pause_mode,
                          on_failure=args.on_failure, timeout=args.timeout, gateways=args.gateway,
                          api_key=args.api_key)
    except UnsafeDeployment as e:
        print(f"vradix.publish: unsafe deployment: {e}", file=sys.stderr)
        return 1
    except PublishError as e:
        print(str(e), file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as e:  # e.g. a gateway that lists no or unhealthy workers: nothing was touched
        print(f"vradix.publish: not published: {e}", file=sys.stderr)
        return 2
    for r in results:
        d = asdict(r)
        d["plan"] = asdict(r.plan) if r.plan else None
        print(json.dumps(d))
    print(json.dumps({"fleet": results.fleet.as_dict()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
