"""The one Settings object: every knob of the platform, read from the environment.

No other module reads os.environ; processes build a Settings and pass what each part needs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINYARD_", extra="ignore")

    data_dir: Path = Field(
        default=Path("~/.trainyard"),
        description="where the local stack keeps its database, Redis files, caches and artifacts",
    )

    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser()

    def cache_dir(self) -> Path:
        """Generated datasets (mnist1d) are cached here."""
        return self.resolved_data_dir() / "cache"
