"""A zoo of small, realistic model code for differential tests of ferrodyn.compile
(tests/test_models.py). Everything is written here; nothing is downloaded.

    vision.py, sequence.py, patterns.py   the models, by family
    cases.py                              each model with inputs in two shapes (a Case)
    harness.py                            run_case: compiled vs eager over capture, cache hit,
                                          reshape and a state change; graph counting
    __main__.py                           `python -m models_zoo`: the comparison table with
                                          torch.compile's graph counts and ferrodyn's reasons

Expectations (which models are captured as one graph today) live in test_models.py.
"""

from models_zoo.cases import CASES, CASES_BY_NAME, Args, Case, invoke
from models_zoo.harness import (
    CountingBackend, Report, assert_same, eager_reasons, ferrodyn_run, is_top_frame, run_case,
    torch_graph_count,
)

__all__ = ["CASES", "CASES_BY_NAME", "Args", "Case", "invoke", "CountingBackend", "Report",
           "assert_same", "eager_reasons", "ferrodyn_run", "is_top_frame", "run_case",
           "torch_graph_count"]
