from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("datatype", "shape", "fp32_contents", "fp64_contents", "raw_contents")
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FP32_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    FP64_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    RAW_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    fp32_contents: _containers.RepeatedScalarFieldContainer[float]
    fp64_contents: _containers.RepeatedScalarFieldContainer[float]
    raw_contents: bytes
    def __init__(self, datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., fp32_contents: _Optional[_Iterable[float]] = ..., fp64_contents: _Optional[_Iterable[float]] = ..., raw_contents: _Optional[bytes] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("query_id", "input", "confidence_alpha", "return_noisy", "model", "model_version")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_ALPHA_FIELD_NUMBER: _ClassVar[int]
    RETURN_NOISY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    input: Tensor
    confidence_alpha: float
    return_noisy: bool
    model: str
    model_version: str
    def __init__(self, query_id: _Optional[str] = ..., input: _Optional[_Union[Tensor, _Mapping]] = ..., confidence_alpha: _Optional[float] = ..., return_noisy: _Optional[bool] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("query_id", "label", "unanimous", "mi_charged", "budget", "confident", "noisy", "cached", "rows", "model", "model_version")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    UNANIMOUS_FIELD_NUMBER: _ClassVar[int]
    MI_CHARGED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CONFIDENT_FIELD_NUMBER: _ClassVar[int]
    NOISY_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    label: int
    unanimous: bool
    mi_charged: float
    budget: Budget
    confident: bool
    noisy: _containers.RepeatedScalarFieldContainer[float]
    cached: bool
    rows: _containers.RepeatedCompositeFieldContainer[RowAnswer]
    model: str
    model_version: str
    def __init__(self, query_id: _Optional[str] = ..., label: _Optional[int] = ..., unanimous: _Optional[bool] = ..., mi_charged: _Optional[float] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., confident: _Optional[bool] = ..., noisy: _Optional[_Iterable[float]] = ..., cached: _Optional[bool] = ..., rows: _Optional[_Iterable[_Union[RowAnswer, _Mapping]]] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...

class RowAnswer(_message.Message):
    __slots__ = ("label", "unanimous", "mi_charged", "confident", "noisy", "cached")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    UNANIMOUS_FIELD_NUMBER: _ClassVar[int]
    MI_CHARGED_FIELD_NUMBER: _ClassVar[int]
    CONFIDENT_FIELD_NUMBER: _ClassVar[int]
    NOISY_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    label: int
    unanimous: bool
    mi_charged: float
    confident: bool
    noisy: _containers.RepeatedScalarFieldContainer[float]
    cached: bool
    def __init__(self, label: _Optional[int] = ..., unanimous: _Optional[bool] = ..., mi_charged: _Optional[float] = ..., confident: _Optional[bool] = ..., noisy: _Optional[_Iterable[float]] = ..., cached: _Optional[bool] = ...) -> None: ...

class GetBudgetRequest(_message.Message):
    __slots__ = ("dataset", "model")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    model: str
    def __init__(self, dataset: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("principal", "scope", "spent", "limit", "remaining", "per_query", "answered", "charged", "mia_bound", "policy", "dataset")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SPENT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    PER_QUERY_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    MIA_BOUND_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    principal: str
    scope: str
    spent: float
    limit: float
    remaining: float
    per_query: float
    answered: int
    charged: int
    mia_bound: float
    policy: str
    dataset: str
    def __init__(self, principal: _Optional[str] = ..., scope: _Optional[str] = ..., spent: _Optional[float] = ..., limit: _Optional[float] = ..., remaining: _Optional[float] = ..., per_query: _Optional[float] = ..., answered: _Optional[int] = ..., charged: _Optional[int] = ..., mia_bound: _Optional[float] = ..., policy: _Optional[str] = ..., dataset: _Optional[str] = ...) -> None: ...
