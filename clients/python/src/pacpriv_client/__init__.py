"""A client for pacpriv's `pacpriv.v1.Privatizer` API.

`Client` sends the API key with every call, builds the input tensor from
plain numbers, and turns every pacpriv error into a `PacprivError`
subclass chosen by its stable `ErrorInfo` reason.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Optional

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from pacpriv.v1 import privatizer_pb2 as pb
from pacpriv.v1 import privatizer_pb2_grpc as rpc

__all__ = [
    "Client",
    "PacprivError",
    "BudgetExhausted",
    "RateLimited",
    "TooManyInFlight",
    "KeyLookupsLimited",
    "OtherDataset",
    "InvalidInput",
    "Unauthenticated",
    "NotReleased",
    "NotFound",
    "ModelUnloaded",
    "TeachersUnavailable",
    "TeacherOutputInvalid",
    "StoreUnavailable",
    "CacheMoved",
    "Contested",
    "EvictedRepeat",
    "NoisyNotKept",
    "AlreadyExists",
    "InternalError",
    "pb",
]

DOMAIN = "pacpriv"


class PacprivError(Exception):
    """A call pacpriv refused or could not answer.

    `reason` is the stable ErrorInfo reason (None when the status carried
    none, e.g. a transport error), `code` the gRPC status code, `charged`
    whether the query may have been charged (only for a withheld answer:
    retry the same query to get it without a second charge), `metadata`
    the ErrorInfo metadata.
    """

    reason: Optional[str] = None

    def __init__(self, message: str, *, code: grpc.StatusCode, reason: Optional[str] = None,
                 charged: bool = False, metadata: Optional[dict] = None):
        super().__init__(message)
        self.message = message
        self.code = code
        if reason is not None:
            self.reason = reason
        self.charged = charged
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.reason or self.code.name}: {self.message}"


class BudgetExhausted(PacprivError):
    """The session's MI budget cannot pay for the request (nothing charged)."""
    reason = "BUDGET_EXHAUSTED"


class RateLimited(PacprivError):
    """Over the principal's query rate; `retry_after` says when to retry (seconds)."""
    reason = "RATE_LIMITED"

    @property
    def retry_after(self) -> float:
        return float(self.metadata.get("retry_after_ms", "1000")) / 1000.0


class TooManyInFlight(PacprivError):
    """The principal has its cap of calls in flight already (nothing charged); send fewer at once."""
    reason = "TOO_MANY_IN_FLIGHT"


class KeyLookupsLimited(PacprivError):
    """Many unknown keys came from this address of late; retry in a second (nothing charged)."""
    reason = "KEY_LOOKUPS_LIMITED"


class OtherDataset(PacprivError):
    """The stored session under this key belongs to another dataset's secret; the operator must rename."""
    reason = "OTHER_DATASET"


class InvalidInput(PacprivError):
    reason = "INVALID_INPUT"


class Unauthenticated(PacprivError):
    reason = "UNAUTHENTICATED"


class NotReleased(PacprivError):
    reason = "NOT_RELEASED"


class NotFound(PacprivError):
    reason = "NOT_FOUND"


class ModelUnloaded(PacprivError):
    """The model version asked is unloaded on this server (nothing was
    charged): ask another version, or none (the newest loaded one)."""
    reason = "MODEL_UNLOADED"


class TeachersUnavailable(PacprivError):
    reason = "TEACHERS_UNAVAILABLE"


class TeacherOutputInvalid(PacprivError):
    reason = "TEACHER_OUTPUT_INVALID"


class StoreUnavailable(PacprivError):
    reason = "STORE_UNAVAILABLE"


class CacheMoved(PacprivError):
    reason = "CACHE_MOVED"


class EvictedRepeat(PacprivError):
    reason = "EVICTED_REPEAT"


class NoisyNotKept(PacprivError):
    reason = "NOISY_NOT_KEPT"


class Contested(PacprivError):
    """The teachers disagree and the server answers only unanimous queries
    (privacy.policy = "unanimous_only"); nothing was charged."""

    reason = "CONTESTED"


class AlreadyExists(PacprivError):
    reason = "ALREADY_EXISTS"


class InternalError(PacprivError):
    reason = "INTERNAL"


_BY_REASON = {c.reason: c for c in PacprivError.__subclasses__()}


def _error(e: grpc.RpcError) -> PacprivError:
    """The typed exception for a failed call."""
    code, message = e.code(), e.details() or ""
    reason, metadata, retry_ms = None, {}, None
    status = rpc_status.from_call(e) if isinstance(e, grpc.Call) else None
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == DOMAIN:
                reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_ms = retry.retry_delay.seconds * 1000 + retry.retry_delay.nanos // 1_000_000
    if retry_ms is not None:
        metadata.setdefault("retry_after_ms", str(retry_ms))
    cls = _BY_REASON.get(reason, PacprivError)
    return cls(message, code=code, reason=reason, charged=metadata.get("charged") == "true", metadata=metadata)


def _tensor(example) -> pb.Tensor:
    """One example (a flat sequence of numbers, sent as its own shape) or a
    batch (a sequence of equally long sequences: [n, features])."""
    rows = list(example)
    if rows and isinstance(rows[0], Iterable) and not isinstance(rows[0], (str, bytes)):
        rows = [list(map(float, r)) for r in rows]
        width = len(rows[0])
        if any(len(r) != width for r in rows):
            raise ValueError("every row of a batch must have the same number of features")
        flat = [v for r in rows for v in r]
        return pb.Tensor(datatype="FP64", shape=[len(rows), width], fp64_contents=flat)
    values = [float(v) for v in rows]
    return pb.Tensor(datatype="FP64", shape=[len(values)], fp64_contents=values)


class Client:
    """A connection to one pacpriv server, as one principal.

    `target` is `host:port`. Plaintext unless `root_certificates` (PEM
    bytes of the CA) is given; `certificate_chain` and `private_key` (PEM)
    present a client certificate (mTLS); `server_name` overrides the name
    the server's certificate is checked against. `timeout` (seconds)
    bounds each unary call.
    """

    def __init__(self, target: str, api_key: str, *, root_certificates: Optional[bytes] = None,
                 certificate_chain: Optional[bytes] = None, private_key: Optional[bytes] = None,
                 server_name: Optional[str] = None, timeout: Optional[float] = 30.0):
        if root_certificates is not None or certificate_chain is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = rpc.PrivatizerStub(self._channel)
        self._metadata = (("x-api-key", api_key),)
        self._timeout = timeout

    def predict(self, example, *, alpha: Optional[float] = None, return_noisy: bool = False,
                query_id: str = "", model: str = "", version: str = "") -> pb.PredictResponse:
        """One example, or a batch of rows answered whole or not at all
        (`response.rows`, one per row), by `model` (empty: the server's
        default model; every model of a dataset is charged to the same
        budget) at `version` (empty: its newest ready one;
        `response.model_version` says which answered)."""
        request = pb.PredictRequest(query_id=query_id, input=_tensor(example), return_noisy=return_noisy,
                                    model=model, model_version=version)
        if alpha is not None:
            request.confidence_alpha = alpha
        try:
            return self._stub.Predict(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise _error(e) from None

    def predict_stream(self, examples: Iterable[Sequence[float]], *,
                       alpha: Optional[float] = None, model: str = "",
                       version: str = "") -> Iterator[pb.PredictResponse]:
        """Answers `examples` in order over one stream (paced, never refused,
        by the rate limit) by `model` (empty: the default) at `version`
        (empty: the newest ready); the first failure ends it, raised typed."""
        def requests():
            for i, example in enumerate(examples):
                r = pb.PredictRequest(query_id=str(i), input=_tensor(example), model=model,
                                      model_version=version)
                if alpha is not None:
                    r.confidence_alpha = alpha
                yield r
        try:
            yield from self._stub.PredictStream(requests(), metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(e) from None

    def budget(self, dataset: str = "", model: str = "") -> pb.Budget:
        """This principal's session account in `dataset`, or else in the
        dataset of `model` (both empty: the default dataset); charges
        nothing."""
        try:
            request = pb.GetBudgetRequest(dataset=dataset, model=model)
            return self._stub.GetBudget(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise _error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
