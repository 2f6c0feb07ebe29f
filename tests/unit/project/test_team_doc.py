"""The example configuration in docs/team.md loads: it is what a team copies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dragoman.core.config import Config
from dragoman.core.config_load import from_dict

DOC = Path(__file__).parents[3] / "docs" / "team.md"


def test_the_example_configuration_loads() -> None:
    (example,) = re.findall(r"## Example configuration\n\n```toml\n(.*?)```", DOC.read_text(), re.S)
    data = tomllib.loads(example)
    if "limits" not in Config.__struct_fields__:  # the limits half lands separately: its keys are checked once it has
        data.pop("limits")
    config = from_dict(data)
    assert config.usage.database_url_env and config.usage.admin_keys_env
    assert set(config.server.tenants) == {"team-a", "team-b"}
