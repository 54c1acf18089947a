"""The base of every configuration section, and the value types they share."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]
ReserveOutput = Literal["estimate", "max_tokens"]
OnShort = Literal["refuse", "cap"]  # a budget with less left than a request's allowance
DomainName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
TeamName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
# Money per million tokens or per period, in `billing.currency`: exact decimals, never floats.
Money = Annotated[Decimal, Field(ge=0, decimal_places=9, allow_inf_nan=False)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
