"""An unchanged tritonclient program against pacpriv's Open Inference
Protocol front-end, over gRPC or HTTP/REST (driven by tests/it/interop.rs).

    python tests/triton_client.py grpc|http ADDR KEY MODEL IMAGES.json [SMALL_KEY [OTHER_MODEL [ADMIN_ADDR TOKEN]]]

Does what a Triton user's program does — liveness, readiness, model
metadata, then one `infer` per image (FP32 [1, 64], requested outputs
`label` and `noisy`, parameter `confidence_alpha`, key in the headers),
then batches of 8 rows in one request — plus the mistakes a user makes,
and prints one JSON document of what came back. The Rust test asserts on
it. With SMALL_KEY (a principal whose budget covers fewer rows than a
batch), the refused batch and the batch it can pay for. With OTHER_MODEL
(a second model over the same data), the repository index and one answer
of that model to the first image. With ADMIN_ADDR and its TOKEN (gRPC),
OTHER_MODEL unloaded there (`unload_model`), what clients then see, and
loaded again (`load_model`).
"""
import json
import math
import sys

import numpy as np
from tritonclient.utils import InferenceServerException

protocol, addr, key, model, images_path = sys.argv[1:6]
small_key = sys.argv[6] if len(sys.argv) > 6 else None
other_model = sys.argv[7] if len(sys.argv) > 7 else None
admin_addr, admin_token = sys.argv[8:10] if len(sys.argv) > 9 else (None, None)
if protocol == "grpc":
    import tritonclient.grpc as tc
else:
    import tritonclient.http as tc
images = json.load(open(images_path))
client = tc.InferenceServerClient(url=addr)
headers = {"x-api-key": key}


def infer(rows, *, model=model, headers=headers, shape=None, outputs=("label", "noisy"), request_id=""):
    x = np.array(rows, dtype=np.float32)
    if shape:
        x = x.reshape(shape)
    tensor = tc.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    requested = [tc.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, [tensor], outputs=requested, headers=headers, request_id=request_id,
                        parameters={"confidence_alpha": 0.1})


def error(call):
    try:
        call()
    except InferenceServerException as e:
        return {"status": str(e.status()), "message": e.message()}
    return None


def described(result):
    """The response's id, parameters and output shapes, whatever the protocol."""
    r = result.get_response()
    if protocol == "grpc":
        params = {n: getattr(p, p.WhichOneof("parameter_choice")) for n, p in r.parameters.items()}
        return r.id, params, {o.name: list(o.shape) for o in r.outputs}
    return r.get("id", ""), r.get("parameters", {}), {o["name"]: list(o["shape"]) for o in r["outputs"]}


def answer(result, outputs=("label", "noisy")):
    rid, params, shapes = described(result)
    a = {"id": rid, "parameters": params, "shapes": shapes, "outputs": sorted(shapes)}
    for name in outputs:
        a[name] = result.as_numpy(name).tolist()
    return a


metadata = client.get_model_metadata(model, as_json=True) if protocol == "grpc" else client.get_model_metadata(model)
report = {
    "live": client.is_server_live(),
    "ready": client.is_server_ready(),
    "model_ready": client.is_model_ready(model),
    "other_model_ready": client.is_model_ready("no-such-model"),
    "metadata": metadata,
    "answers": [answer(infer([pixels], request_id=f"img-{k}")) for k, pixels in enumerate(images[:5])],
}
# The first image again, label only: the session's cached answer.
report["label_only"] = answer(infer([images[0]], outputs=("label",)), outputs=("label",))
# Eight rows in one request: two answered above (cached), five new ones,
# and the first new one again (answered from its own row: free).
rows = [images[0], images[1], images[5], images[6], images[7], images[5], images[8], images[9]]
report["batch"] = answer(infer(rows, outputs=("label", "mi_charged", "noisy")), outputs=("label", "mi_charged", "noisy"))
if small_key:
    small = {"x-api-key": small_key}
    fresh = [images[k] for k in range(10, 18)]
    report["small_refused"] = error(lambda: infer(fresh, headers=small, outputs=("label",)))
    paid = infer(fresh[:3], headers=small, outputs=("label", "mi_charged"))
    report["small_paid"] = answer(paid, outputs=("label", "mi_charged"))
if other_model:
    index = client.get_model_repository_index(as_json=True) if protocol == "grpc" \
        else client.get_model_repository_index()
    report["index"] = index["models"] if protocol == "grpc" else index
    report["other"] = answer(infer([images[0]], model=other_model, outputs=("label", "mi_charged")),
                             outputs=("label", "mi_charged"))
if other_model and admin_addr and protocol == "grpc":
    admin = tc.InferenceServerClient(url=admin_addr)
    auth = {"authorization": f"Bearer {admin_token}"}
    report["unload_on_client_listener"] = error(lambda: client.unload_model(other_model, headers=auth))
    report["unload_without_token"] = error(lambda: admin.unload_model(other_model, headers=headers))
    admin.unload_model(other_model, headers=auth)
    index = client.get_model_repository_index(as_json=True)["models"]
    report["after_unload"] = {
        "index": [m for m in index if m["name"] == other_model],
        "ready": client.is_model_ready(other_model),
        "infer": error(lambda: infer([images[1]], model=other_model, outputs=("label",))),
    }
    admin.load_model(other_model, headers=auth)
    report["after_load_ready"] = client.is_model_ready(other_model)
    report["after_load"] = answer(infer([images[1]], model=other_model, outputs=("label", "mi_charged")),
                                  outputs=("label", "mi_charged"))


def statistics(**kwargs):
    """get_inference_statistics()'s model_stats (gRPC's as proto3 JSON: uint64 as strings, zeros left out)."""
    if protocol == "grpc":
        return client.get_inference_statistics(headers=headers, as_json=True, **kwargs).get("model_stats", [])
    return client.get_inference_statistics(headers=headers, **kwargs)["model_stats"]


report["statistics"] = {
    "all": statistics(),
    "model": statistics(model_name=model),
    "version": statistics(model_name=model, model_version="1"),
    "stranger": error(lambda: client.get_inference_statistics(model_name=model, headers={})),
    "unknown": error(lambda: statistics(model_name="no-such-model")),
}
report["server_metadata"] = client.get_server_metadata(as_json=True) if protocol == "grpc" \
    else client.get_server_metadata()
report["errors"] = {
    "unknown_key": error(lambda: infer([images[0]], headers={"x-api-key": "not-a-key"})),
    "no_key": error(lambda: infer([images[0]], headers={})),
    "wrong_shape": error(lambda: infer([images[0][:63]])),
    "nan": error(lambda: infer([[math.nan] + images[0][1:]])),
    "unknown_model": error(lambda: infer([images[0]], model="no-such-model")),
}
print(json.dumps(report))
