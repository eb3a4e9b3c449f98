"""The failure converter: an operator's refusal travels as one line, with no stack trace.

The Temporal UI shows an update's failure with its stack trace (server file paths
included). Refusals and bad update input are a person's mistake, not a bug: their
`ApplicationError` types (`protocol.operator.OperatorErrorType`) are sent without
a trace. Every other failure keeps its trace for debugging.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverter, PayloadConverter
from temporalio.exceptions import ApplicationError

from protocol.operator import OPERATOR_FACING_ERROR_TYPES


class OperatorFacingFailureConverter(DefaultFailureConverter):
    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, ApplicationError) and exception.type in (
            OPERATOR_FACING_ERROR_TYPES
        ):
            failure.stack_trace = ""
            failure.ClearField("cause")


# The pydantic converter (both sides, STYLE rule 4) with trace-free refusals.
DATA_CONVERTER: Final = dataclasses.replace(
    pydantic_data_converter, failure_converter_class=OperatorFacingFailureConverter
)


def is_configured(converter: DataConverter) -> bool:
    return isinstance(converter.failure_converter, OperatorFacingFailureConverter)
