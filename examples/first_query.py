"""A first private prediction with a stock gRPC client (grpcio).

    pip install grpcio grpcio-tools
    python3 examples/first_query.py [ADDR]     # default 127.0.0.1:50051

Sends one held-out-style 8x8 digit image (a zero) to a running
`pacpriv serve` with the demo key, prints the answer and the budget.
"""
import pathlib
import sys
import tempfile

import grpc
from grpc_tools import protoc

root = pathlib.Path(__file__).resolve().parent.parent
stubs = tempfile.mkdtemp()
protoc.main(["protoc", f"-I{root / 'proto'}", f"--python_out={stubs}", f"--grpc_python_out={stubs}", "pacpriv/v1/privatizer.proto"])
sys.path.insert(0, stubs)
from pacpriv.v1 import privatizer_pb2 as pb, privatizer_pb2_grpc as rpc  # noqa: E402

# A handwritten zero from the optical-digits data (pixel counts 0-16).
ZERO = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
        0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]

addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
stub = rpc.PrivatizerStub(grpc.insecure_channel(addr))
request = pb.PredictRequest(
    query_id="first",
    input=pb.Tensor(datatype="FP32", shape=[64], fp32_contents=ZERO),
    confidence_alpha=0.05,
)
answer = stub.Predict(request, metadata=[("x-api-key", "demo-key")])
b = answer.budget
print(f"label {answer.label}  unanimous {answer.unanimous}  confident {answer.confident}  charged {answer.mi_charged:.3e} nats")
print(f"budget: spent {b.spent:.3e} of {b.limit:.3e} nats after {b.answered} answer(s); MIA bound {100 * b.mia_bound:.4f} %")
