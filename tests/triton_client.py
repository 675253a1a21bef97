"""An unchanged tritonclient program against pacpriv's Open Inference
Protocol front-end (driven by tests/it/interop.rs).

    python tests/triton_client.py ADDR KEY MODEL IMAGES.json

Does what a Triton user's program does — liveness, readiness, model
metadata, then one `infer` per image (raw FP32 [1, 64], requested outputs
`label` and `noisy`, parameter `confidence_alpha`, key in the headers) —
plus the mistakes a user makes, and prints one JSON document of what came
back. The Rust test asserts on it.
"""
import json
import math
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

addr, key, model, images_path = sys.argv[1:5]
images = json.load(open(images_path))
client = grpcclient.InferenceServerClient(url=addr)
headers = {"x-api-key": key}


def infer(pixels, *, model=model, headers=headers, shape=None, noisy=True, request_id=""):
    x = np.array([pixels], dtype=np.float32)
    if shape:
        x = x.reshape(shape)
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    outputs = [grpcclient.InferRequestedOutput("label")]
    if noisy:
        outputs.append(grpcclient.InferRequestedOutput("noisy"))
    return client.infer(model, [tensor], outputs=outputs, headers=headers, request_id=request_id,
                        parameters={"confidence_alpha": 0.1})


def error(call):
    try:
        call()
    except InferenceServerException as e:
        return {"status": e.status(), "message": e.message()}
    return None


def value(p):
    return getattr(p, p.WhichOneof("parameter_choice"))


report = {
    "live": client.is_server_live(),
    "ready": client.is_server_ready(),
    "model_ready": client.is_model_ready(model),
    "other_model_ready": client.is_model_ready("no-such-model"),
    "metadata": client.get_model_metadata(model, as_json=True),
    "answers": [],
}
for k, pixels in enumerate(images):
    result = infer(pixels, request_id=f"img-{k}")
    response = result.get_response()
    report["answers"].append({
        "id": response.id,
        "label": result.as_numpy("label").tolist(),
        "noisy": result.as_numpy("noisy").tolist(),
        "noisy_shape": list(next(o.shape for o in response.outputs if o.name == "noisy")),
        "parameters": {name: value(p) for name, p in response.parameters.items()},
    })
# The first image again, label only: the session's cached answer.
label_only = infer(images[0], noisy=False)
report["label_only_outputs"] = [o.name for o in label_only.get_response().outputs]
report["label_only"] = label_only.as_numpy("label").tolist()
report["label_only_parameters"] = {n: value(p) for n, p in label_only.get_response().parameters.items()}
report["errors"] = {
    "unknown_key": error(lambda: infer(images[0], headers={"x-api-key": "not-a-key"})),
    "no_key": error(lambda: infer(images[0], headers={})),
    "wrong_shape": error(lambda: infer(images[0][:63])),
    "batch_of_two": error(lambda: infer(images[0] + images[1], shape=(2, 64))),
    "nan": error(lambda: infer([math.nan] + images[0][1:])),
    "unknown_model": error(lambda: infer(images[0], model="no-such-model")),
}
print(json.dumps(report))
