"""A real grpcio client with a gRPC retry policy (service config), as an
application backend configures one, calling pacpriv's Predict once
(driven by tests/it/retry.rs).

    python tests/retry_client.py ADDR KEY REQUEST_HEX

The request is a serialized pacpriv.v1.PredictRequest (the Rust test
encodes it, so no stubs are generated here). gRPC retries the call on
UNAVAILABLE, up to 5 attempts, by itself. Prints one JSON document: the
serialized response, or the final status and its ErrorInfo.
"""
import json
import sys

import grpc

addr, key, request_hex = sys.argv[1:4]
service_config = json.dumps({
    "methodConfig": [{
        "name": [{"service": "pacpriv.v1.Privatizer", "method": "Predict"}],
        "retryPolicy": {
            "maxAttempts": 5,
            "initialBackoff": "0.2s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]
})
channel = grpc.insecure_channel(addr, options=[("grpc.enable_retries", 1), ("grpc.service_config", service_config)])
predict = channel.unary_unary(
    "/pacpriv.v1.Privatizer/Predict",
    request_serializer=lambda b: b,
    response_deserializer=lambda b: b,
)
try:
    response = predict(bytes.fromhex(request_hex), metadata=[("x-api-key", key)], timeout=60)
    print(json.dumps({"ok": True, "response": response.hex()}))
except grpc.RpcError as e:
    details = dict(e.trailing_metadata() or ()).get("grpc-status-details-bin", b"")
    print(json.dumps({"ok": False, "code": e.code().name, "message": e.details(), "status_details": details.hex()}))
