"""The architecture rule: the ragen library imports no orchestration (Prefect), tracking (MLflow) or versioning
(DVC) package; tasks/ and flows/ do."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

CHECK = """
import importlib, pkgutil, sys
import ragen
for m in pkgutil.walk_packages(ragen.__path__, "ragen."):
    importlib.import_module(m.name)
bad = sorted({n.split(".")[0] for n in sys.modules} & {"prefect", "mlflow", "dvc"})
print(",".join(bad))
"""


def test_ragen_imports_no_orchestration_packages():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "", f"ragen/ imported {out.stdout.strip()}"
