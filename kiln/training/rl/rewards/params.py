"""Validation of a built-in reward's `params`, with errors naming the field."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from kiln.platform.errors import ConfigError, format_validation_error

P = TypeVar("P", bound=BaseModel)


def parse_params(model: type[P], params: dict, where: str) -> P:
    try:
        return model.model_validate(params)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, prefix=where, model=model)) from None
