"""A first private prediction with the Python client package.

    pip install ./clients/python
    python3 examples/first_query.py [ADDR [KEY]]   # default 127.0.0.1:50051, demo-key

Sends one held-out-style 8x8 digit image (a zero) to a running
`pacpriv serve` with the demo principal's key (the published "demo-key",
which a server serves only on loopback; a container's is the one you gave
it), prints the answer and the budget; then
shows what a spent budget looks like to a program (a typed exception).
"""
import sys

from pacpriv_client import BudgetExhausted, Client, RateLimited

# A handwritten zero from the optical-digits data (pixel counts 0-16).
ZERO = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0,
        0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]

addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
key = sys.argv[2] if len(sys.argv) > 2 else "demo-key"
with Client(addr, api_key=key) as client:
    try:
        answer = client.predict(ZERO, alpha=0.05, query_id="first")
    except BudgetExhausted as e:
        sys.exit(f"the demo principal's budget is spent: {e}")
    except RateLimited as e:
        sys.exit(f"rate limited: retry in {e.retry_after:.3f} s")
    b = answer.budget
    print(f"label {answer.label}  unanimous {answer.unanimous}  confident {answer.confident}  "
          f"charged {answer.mi_charged:.3e} nats")
    print(f"budget: spent {b.spent:.3e} of {b.limit:.3e} nats after {b.answered} answer(s); "
          f"MIA bound {100 * b.mia_bound:.4f} %")
