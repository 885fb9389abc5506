"""Benchmark driver: runs every `benches/bench_<group>.py` and prints ferrodyn against its
reference (torch.compile, torch.utils.weak, torch's make_fx) as ratios measured in one process.

Each bench module defines `GROUP` (str) and `run(rounds: int) -> list[dict]`, each dict with
"case", "ferrodyn", "reference", "unit" (and optionally "reference_name", "note"). Times are
medians over many rounds, measured side by side in this process.

    python benches/run.py [--json FILE] [--group NAME ...] [--rounds N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def discover(groups: list[str] | None):
    for path in sorted(HERE.glob("bench_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if groups and mod.GROUP not in groups:
            continue
        yield mod


def fmt(v: float, unit: str) -> str:
    return f"{v:,.1f} {unit}" if v < 1e5 else f"{v:,.0f} {unit}"


def print_table(group: str, rows: list[dict]) -> None:
    ref = rows[0].get("reference_name", "reference") if rows else "reference"
    print(f"\n## {group}  (ratio = ferrodyn / {ref}; lower is better)\n")
    w = max([len(r["case"]) for r in rows] + [4])
    print(f"| {'case':<{w}} | {'ferrodyn':>14} | {ref:>16} | {'ratio':>7} |")
    print(f"|{'-' * (w + 2)}|{'-' * 16}|{'-' * 18}|{'-' * 9}|")
    for r in rows:
        print(f"| {r['case']:<{w}} | {fmt(r['ferrodyn'], r['unit']):>14} | "
              f"{fmt(r['reference'], r['unit']):>16} | {r['ratio']:>7.3f} |")
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--group", action="append", help="only these groups")
    ap.add_argument("--rounds", type=int, default=0, help="rounds per case (0: each bench's default)")
    args = ap.parse_args(argv)
    out = []
    for mod in discover(args.group):
        rows = mod.run(args.rounds) if args.rounds else mod.run()
        for r in rows:
            r["group"] = mod.GROUP
            r["ratio"] = r["ferrodyn"] / r["reference"] if r["reference"] else float("nan")
        print_table(mod.GROUP, rows)
        out.extend(rows)
    if args.json:
        keys = ("group", "case", "ferrodyn", "reference", "unit", "ratio")
        pathlib.Path(args.json).write_text(json.dumps(
            {"benchmarks": [{k: r[k] for k in keys} for r in out]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
