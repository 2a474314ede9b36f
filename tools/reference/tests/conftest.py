"""Shared test helpers: path setup and the agreement report printed at the end of the run."""
import json
import os
import sys
from pathlib import Path

import pytest

REF_DIR = Path(__file__).resolve().parents[1]
REPO = REF_DIR.parents[1]
sys.path.insert(0, str(REF_DIR))

_MEASURED = []


def rel_err(a, b):
    """max |a - b| / max |b| (b is the oracle), computed in float64."""
    import torch
    a = torch.as_tensor(a).to(torch.float64)
    b = torch.as_tensor(b).to(torch.float64)
    den = b.abs().max().item()
    num = (a - b).abs().max().item()
    return num / den if den > 0 else num


@pytest.fixture
def measure(request):
    """measure(name, value, limit) records a measured error and asserts value <= limit."""
    def _m(name, value, limit=None):
        _MEASURED.append((request.node.nodeid.split("::")[-1], name, float(value), limit))
        print(f"[agreement] {name}: {value:.3e}" + (f" (limit {limit:.0e})" if limit is not None else ""))
        if limit is not None:
            assert value <= limit, f"{name}: {value:.3e} > {limit:.0e}"
    return _m


def pytest_terminal_summary(terminalreporter):
    if not _MEASURED:
        return
    tr = terminalreporter
    tr.section("measured agreement (max|ours - oracle| / max|oracle| unless named otherwise)")
    for test, name, v, lim in _MEASURED:
        tr.write_line(f"{name:<72s} {v:10.3e}" + (f"   <= {lim:.0e}" if lim is not None else ""))
    out = REF_DIR / "out"
    out.mkdir(exist_ok=True)
    (out / "agreement.json").write_text(json.dumps(
        [{"test": t, "name": n, "value": v, "limit": l} for t, n, v, l in _MEASURED], indent=1))
