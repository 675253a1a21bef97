#!/usr/bin/env python3
"""Smoke test of a running `pacpriv serve` through the stock grpcio client.

Usage: smoke_client.py ADDR STUBDIR

ADDR is host:port of the server; STUBDIR holds the Python stubs generated
from proto/pacpriv/v1/privatizer.proto by grpc_tools.protoc. Prints one line
per check, exits 1 at the first failure, and ends with a line
`SUMMARY checks=N answers=A demo_spent=X` for smoke.sh.

Expects the server started as smoke.sh starts it: principal "demo" (key
demo-key), principal "tiny" (key tiny-key) whose budget is exactly three
answers, policy "paper", scope "per_principal".
"""

import math
import struct
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from google.rpc import error_details_pb2

ADDR, STUBDIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, STUBDIR)
from pacpriv.v1 import privatizer_pb2 as pb  # noqa: E402
from pacpriv.v1 import privatizer_pb2_grpc as pb_grpc  # noqa: E402

TIMEOUT = 30  # seconds, every RPC
DEMO = [("x-api-key", "demo-key")]
TINY = [("x-api-key", "tiny-key")]
PASSED = 0


def check(name, cond, detail=""):
    """Records one check; stops the whole run at the first failure."""
    global PASSED
    if not cond:
        print(f"FAIL {name}" + (f": {detail}" if detail else ""), flush=True)
        sys.exit(1)
    PASSED += 1
    print(f"ok   {name}" + (f" ({detail})" if detail else ""), flush=True)


def rpc_error(call):
    """Runs call(); returns the grpc.RpcError it raised, or None if it succeeded."""
    try:
        call()
    except grpc.RpcError as e:
        return e
    return None


def code_of(err):
    return err.code() if err is not None else grpc.StatusCode.OK


# 8x8 digit-like images, values 0..16 like the optical-digits data.
PATTERNS = {
    "zero": ["..####..", ".#....#.", "#......#", "#......#",
             "#......#", "#......#", ".#....#.", "..####.."],
    "one": ["...##...", "..###...", ".#.##...", "...##...",
            "...##...", "...##...", "...##...", ".######."],
    "seven": ["########", "......#.", ".....#..", "....#...",
              "...#....", "..#.....", "..#.....", "..#....."],
    "four": ["....##..", "...#.#..", "..#..#..", ".#...#..",
             "########", ".....#..", ".....#..", ".....#.."],
    "eight": ["..####..", ".#....#.", ".#....#.", "..####..",
              ".#....#.", "#......#", ".#....#.", "..####.."],
}


def image(name, ink=16.0):
    return [ink if ch == "#" else 0.0 for row in PATTERNS[name] for ch in row]


def tensor(values, shape=(64,), datatype="FP32"):
    return pb.Tensor(datatype=datatype, shape=list(shape), fp32_contents=values)


def request(query_id, values, **kw):
    return pb.PredictRequest(query_id=query_id, input=tensor(values), **kw)


def budget_key(b):
    """The fields of a Budget that must not move unless an answer is charged."""
    return (b.principal, b.spent, b.limit, b.remaining, b.answered, b.charged)


def main():
    channel = grpc.insecure_channel(ADDR)
    grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
    stub = pb_grpc.PrivatizerStub(channel)
    health = health_pb2_grpc.HealthStub(channel)

    # --- health ---------------------------------------------------------
    for service in ["", "pacpriv.v1.Privatizer"]:
        r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
        check(f"health {service!r} SERVING", r.status == health_pb2.HealthCheckResponse.SERVING,
              health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))

    # --- Predict, demo key ------------------------------------------------
    start = stub.GetBudget(pb.GetBudgetRequest(), metadata=DEMO, timeout=TIMEOUT)
    check("demo budget at start", start.principal == "demo" and start.answered == 0
          and start.spent == 0 and start.policy == "paper" and start.scope == "per_principal",
          f"principal={start.principal} answered={start.answered} spent={start.spent} "
          f"policy={start.policy} scope={start.scope}")
    inputs = [(n, image(n)) for n in PATTERNS] + [(n + "-dim", image(n, ink=9.0)) for n in PATTERNS]
    prev = start
    labels = []
    for i, (name, values) in enumerate(inputs):
        qid = f"smoke-{i}-{name}"
        r = stub.Predict(request(qid, values), metadata=DEMO, timeout=TIMEOUT)
        b = r.budget
        ok = (r.query_id == qid and 0 <= r.label <= 9 and r.mi_charged == b.per_query > 0
              and b.policy == "paper" and b.spent > prev.spent and b.remaining < prev.remaining
              and b.answered == prev.answered + 1 and b.charged == prev.charged + 1
              and not r.HasField("confident"))
        check(f"predict {qid}", ok,
              f"label={r.label} unanimous={r.unanimous} charged={r.mi_charged:.3e} "
              f"spent={b.spent:.6e} remaining={b.remaining:.6e} answered={b.answered}")
        labels.append(r.label)
        prev = b
    check("predict labels not all identical", len(set(labels)) > 1, f"labels={labels}")

    r = stub.Predict(request("smoke-alpha", image("one", ink=12.0), confidence_alpha=0.05), metadata=DEMO,
                     timeout=TIMEOUT)
    check("predict with confidence_alpha has `confident`",
          r.HasField("confident") and r.budget.answered == prev.answered + 1 and not r.cached,
          f"label={r.label} confident={r.confident}")
    # The same example again: the session's cached answer, free.
    again = stub.Predict(request("smoke-repeat", inputs[0][1]), metadata=DEMO, timeout=TIMEOUT)
    check("a repeated query is cached: same label, nothing charged",
          again.cached and again.label == labels[0] and again.mi_charged == 0
          and again.budget.answered == r.budget.answered and again.budget.spent == r.budget.spent,
          f"cached={again.cached} label={again.label} vs {labels[0]} charged={again.mi_charged}")
    last = again.budget

    # --- GetBudget --------------------------------------------------------
    b1 = stub.GetBudget(pb.GetBudgetRequest(), metadata=DEMO, timeout=TIMEOUT)
    b2 = stub.GetBudget(pb.GetBudgetRequest(), metadata=DEMO, timeout=TIMEOUT)
    check("GetBudget matches last Predict", b1 == last, f"spent={b1.spent:.6e} answered={b1.answered}")
    check("GetBudget charges nothing", b1 == b2)
    check("mia_bound in (0.5, 1)", 0.5 < b1.mia_bound < 1, f"{b1.mia_bound}")

    # --- PredictStream ----------------------------------------------------
    names = list(PATTERNS)
    stream_ids = [f"stream-{i}" for i in range(5)]
    reqs = [request(q, image(names[i % len(names)], ink=11.0)) for i, q in enumerate(stream_ids)]
    responses = list(stub.PredictStream(iter(reqs), metadata=DEMO, timeout=TIMEOUT))
    got_ids = [r.query_id for r in responses]
    check("PredictStream answers 5 in order", got_ids == stream_ids, f"{got_ids}")
    answered = [r.budget.answered for r in responses]
    check("PredictStream budget.answered +1 each",
          answered == list(range(last.answered + 1, last.answered + 6)), f"{answered}")
    demo_budget = stub.GetBudget(pb.GetBudgetRequest(), metadata=DEMO, timeout=TIMEOUT)
    check("GetBudget after stream", demo_budget == responses[-1].budget)

    # --- budget exhaustion, tiny key ----------------------------------------
    tiny_start = stub.GetBudget(pb.GetBudgetRequest(), metadata=TINY, timeout=TIMEOUT)
    check("tiny budget = 3 answers", tiny_start.principal == "tiny"
          and tiny_start.limit == 3 * tiny_start.per_query and tiny_start.answered == 0,
          f"limit={tiny_start.limit} per_query={tiny_start.per_query}")
    for i in range(3):
        r = stub.Predict(request(f"tiny-{i}", image("seven", ink=10.0 + i)), metadata=TINY, timeout=TIMEOUT)
        check(f"tiny predict {i + 1}/3 answered", r.budget.answered == i + 1,
              f"spent={r.budget.spent!r} remaining={r.budget.remaining!r}")
    err = rpc_error(lambda: stub.Predict(request("tiny-3", image("seven", ink=13.0)), metadata=TINY, timeout=TIMEOUT))
    check("tiny predict 4 RESOURCE_EXHAUSTED", code_of(err) == grpc.StatusCode.RESOURCE_EXHAUSTED,
          f"{code_of(err)}: {err.details() if err else ''}")
    msg = err.details()
    status = rpc_status.from_call(err)
    infos = []
    for any_detail in (status.details if status else []):
        info = error_details_pb2.ErrorInfo()
        if any_detail.Is(info.DESCRIPTOR):
            any_detail.Unpack(info)
            infos.append(info)
    check("ErrorInfo BUDGET_EXHAUSTED detail", len(infos) == 1 and infos[0].reason == "BUDGET_EXHAUSTED",
          f"{[(i.reason, i.domain) for i in infos]}")
    meta = dict(infos[0].metadata)
    check("exhausted message states spent and limit",
          "spent" in msg and meta.get("spent", "?") in msg and meta.get("limit", "?") in msg, msg)
    check("ErrorInfo metadata spent/limit/charge", {"spent", "limit", "charge"} <= meta.keys()
          and math.isclose(float(meta["spent"]), float(meta["limit"]))
          and float(meta["charge"]) == tiny_start.per_query, f"{meta}")
    tiny_end = stub.GetBudget(pb.GetBudgetRequest(), metadata=TINY, timeout=TIMEOUT)
    check("refused query not charged", tiny_end.answered == 3 and tiny_end.remaining <= 0
          and tiny_end.spent == tiny_end.limit,
          f"answered={tiny_end.answered} spent={tiny_end.spent!r} remaining={tiny_end.remaining!r}")
    err = rpc_error(lambda: stub.GetBudget(pb.GetBudgetRequest(), metadata=TINY, timeout=TIMEOUT))
    check("GetBudget still works when exhausted", err is None)
    r = stub.Predict(request("tiny-repeat", image("seven", ink=10.0)), metadata=TINY, timeout=TIMEOUT)
    check("an exhausted session still gets its cached answers", r.cached and r.budget.answered == 3,
          f"cached={r.cached} answered={r.budget.answered}")
    check("tiny does not touch demo", stub.GetBudget(pb.GetBudgetRequest(), metadata=DEMO, timeout=TIMEOUT) == demo_budget)

    # --- bad tensors: INVALID_ARGUMENT, nothing charged -----------------------
    digit = image("zero")
    nan = list(digit)
    nan[10] = float("nan")
    bad = {
        "shape [63]": pb.Tensor(datatype="FP32", shape=[63], fp32_contents=digit[:63]),
        "dtype INT64": pb.Tensor(datatype="INT64", shape=[64], raw_contents=struct.pack("<64q", *map(int, digit))),
        "NaN value": pb.Tensor(datatype="FP32", shape=[64], fp32_contents=nan),
        "FP32 declared, fp64_contents sent": pb.Tensor(datatype="FP32", shape=[64], fp64_contents=digit),
        "no values": pb.Tensor(datatype="FP32", shape=[64]),
        "input missing": None,
    }
    for name, t in bad.items():
        req = pb.PredictRequest(query_id="bad", input=t) if t is not None else pb.PredictRequest(query_id="bad")
        err = rpc_error(lambda: stub.Predict(req, metadata=DEMO, timeout=TIMEOUT))
        after = stub.GetBudget(pb.GetBudgetRequest(), metadata=DEMO, timeout=TIMEOUT)
        check(f"bad tensor ({name}) INVALID_ARGUMENT, nothing charged",
              code_of(err) == grpc.StatusCode.INVALID_ARGUMENT and budget_key(after) == budget_key(demo_budget),
              f"{code_of(err)}: {err.details() if err else ''}")
    for alpha in [0.0, 1.0, float("nan")]:
        err = rpc_error(lambda: stub.Predict(request("bad-alpha", digit, confidence_alpha=alpha),
                                             metadata=DEMO, timeout=TIMEOUT))
        check(f"confidence_alpha={alpha} INVALID_ARGUMENT", code_of(err) == grpc.StatusCode.INVALID_ARGUMENT,
              f"{code_of(err)}: {err.details() if err else ''}")
    err = rpc_error(lambda: list(stub.PredictStream(
        iter([pb.PredictRequest(query_id="s-bad", input=bad["NaN value"])]), metadata=DEMO, timeout=TIMEOUT)))
    check("PredictStream bad tensor INVALID_ARGUMENT", code_of(err) == grpc.StatusCode.INVALID_ARGUMENT,
          f"{code_of(err)}: {err.details() if err else ''}")

    # --- authentication -----------------------------------------------------
    for name, md in [("unknown key", [("x-api-key", "nope")]), ("missing key", []),
                     ("unknown bearer", [("authorization", "Bearer nope")])]:
        err = rpc_error(lambda: stub.Predict(request("auth", digit), metadata=md, timeout=TIMEOUT))
        check(f"Predict with {name} UNAUTHENTICATED", code_of(err) == grpc.StatusCode.UNAUTHENTICATED,
              f"{code_of(err)}")
        err = rpc_error(lambda: stub.GetBudget(pb.GetBudgetRequest(), metadata=md, timeout=TIMEOUT))
        check(f"GetBudget with {name} UNAUTHENTICATED", code_of(err) == grpc.StatusCode.UNAUTHENTICATED,
              f"{code_of(err)}")
    b = stub.GetBudget(pb.GetBudgetRequest(), metadata=[("authorization", "Bearer demo-key")], timeout=TIMEOUT)
    check("authorization: Bearer demo-key works", b.principal == "demo")

    # --- oversized message --------------------------------------------------
    # Over server.max_message_bytes (65536 by default): refused by gRPC
    # itself (tonic) with OUT_OF_RANGE, before any of pacpriv's code runs.
    big = pb.PredictRequest(query_id="big", input=pb.Tensor(datatype="FP32", shape=[64], raw_contents=b"\0" * 100_000))
    err = rpc_error(lambda: stub.Predict(big, metadata=DEMO, timeout=TIMEOUT))
    after = stub.GetBudget(pb.GetBudgetRequest(), metadata=DEMO, timeout=TIMEOUT)
    check("100 kB request refused with OUT_OF_RANGE, nothing charged",
          code_of(err) == grpc.StatusCode.OUT_OF_RANGE and budget_key(after) == budget_key(demo_budget),
          f"{code_of(err)}: {err.details() if err else ''}")

    # The server is still healthy and answering after all of the above.
    r = stub.Predict(request("final", image("eight", ink=7.0)), metadata=DEMO, timeout=TIMEOUT)
    check("still answering afterwards", r.budget.answered == demo_budget.answered + 1)

    answers = r.budget.answered + tiny_end.answered
    print(f"SUMMARY checks={PASSED} answers={answers} demo_spent={r.budget.spent:.6e}", flush=True)


if __name__ == "__main__":
    main()
