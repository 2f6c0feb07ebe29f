"""scripts/check-image, the manual check of the Dockerfile's image, in the parts that decide
what it asks the container engine for."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-image"


def load_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("check_image", str(SCRIPT))
    spec = importlib.util.spec_from_loader("check_image", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("tool", "never_pull"),
    [
        ("podman", ["--pull=never"]),  # the base may be a local stand-in: never reach for a registry
        ("docker", []),  # docker's --pull is a yes/no ("pull newer"): --pull=never is refused, and unneeded
    ],
)
def test_the_build_never_pulls_in_each_engine_s_own_words(tool: str, never_pull: list[str]) -> None:
    command = load_script().build_command(tool, "-t", "dragoman:check", ".")
    assert command[:2] == [tool, "build"] and command[-3:] == ["-t", "dragoman:check", "."]
    assert [arg for arg in command if arg.startswith("--pull")] == never_pull
