"""Double of modules/api/models.py ScriptArg / ScriptInfo (~L307-320), pydantic models like the real ones."""

from typing import Any

from pydantic import BaseModel, Field


class ScriptArg(BaseModel):
    label: str = Field(default=None, title="Label")
    value: Any | None = Field(default=None, title="Value")
    minimum: Any | None = Field(default=None, title="Minimum")
    maximum: Any | None = Field(default=None, title="Minimum")
    step: Any | None = Field(default=None, title="Minimum")
    choices: list[str] | None = Field(default=None, title="Choices")


class ScriptInfo(BaseModel):
    name: str = Field(default=None, title="Name")
    is_alwayson: bool = Field(default=None, title="IsAlwayson")
    is_img2img: bool = Field(default=None, title="IsImg2img")
    args: list[ScriptArg] = Field(title="Arguments")
