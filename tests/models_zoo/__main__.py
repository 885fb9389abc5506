"""Print the zoo table: ferrodyn graphs, torch.compile graphs, correctness, why eager.

    PYTHONPATH=python:tests .venv/bin/python -m models_zoo [name ...]
"""

import sys

from models_zoo.cases import CASES, CASES_BY_NAME
from models_zoo.harness import eager_reasons, ferrodyn_run, torch_graph_count

def _main(names: list[str]) -> None:
    rows = [("model", "ferrodyn graphs (after 2nd call/reshape)", "torch.compile graphs", "correct?", "reason if eager")]
    for case in [CASES_BY_NAME[n] for n in names] if names else CASES:
        try:
            rep, _ = ferrodyn_run(case, grad=case.grad)
            ok, fd = "yes", f"{rep.graphs_first} ({rep.graphs_hit}/{rep.graphs_reshaped})"
        except AssertionError as e:
            ok, fd = f"NO: {str(e).splitlines()[0][:80]}", "?"
        except Exception as e:  # a crash is reported, not hidden
            ok, fd = f"CRASH: {type(e).__name__}: {str(e).splitlines()[0][:80]}", "?"
        tc = torch_graph_count(case)
        reasons = eager_reasons(case)
        why = "; ".join(r.split("\n")[0] for r in reasons)[:300]
        rows.append((case.name, fd, str(tc), ok, why))
    for r in rows:
        print(" | ".join(r))


_main(sys.argv[1:])
