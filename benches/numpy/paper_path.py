"""The paper's per-query path in numpy: the baseline `pacpriv-bench math`
runs beside the Rust mechanism (issue 26 §1 and, with --vector, §2).

For each case (d, pattern) it times N queries of Algorithm 1 as the paper
states it, on the same inputs as the Rust side: m teachers' one-hot
outputs Y (m x d) — or, with --vector, also their jittered score vectors
(vector mode, issue 26 §2) — a posterior whose log-weights span e^-8 .. 1, b = 2^-32.
Per query:
  w = softmax(log w); X = sqrt(w) * (Y - w^T Y)      (weighted, centred)
  U, S, V^T = svd(X) (thin, m x d)                  C = V diag(S^2) V^T
  Sigma = V diag(sqrt(l) * sum(sqrt(l)) / (2b)) V^T  (Theorem 2.4, l = S^2 > 0)
  r = Y[s*] + V (sqrt(var) * g), g ~ N(0, I)         label = argmax r
  l_i = -1/2 (r - y_i)^T Sigma^+ (r - y_i)           (Eq. 4, every teacher)
  log w += l; log w -= logsumexp(log w)
Output: one JSON line per case, {"d", "pattern", "queries", "ns_per_query"},
the median of 5 batches.

Run: python3 benches/numpy/paper_path.py --m 128 --queries 2000
(needs numpy; `pip install numpy`). Not part of the service.
"""

import argparse
import json
import time

import numpy as np

PATTERNS = {
    "k2_120v8": [8],
    "k3_110v12v6": [12, 6],
    "k8_spread": [6, 5, 4, 4, 3, 3, 2],
}


def jittered_scores(m, d):
    """Vector mode: the Rust bench's softmax-like scores, mostly agreeing,
    with a deterministic per-teacher jitter in [0, 0.01)."""
    i = np.arange(m)[:, None]
    j = np.arange(d)[None, :]
    base = np.where(j == 0, 0.8, 0.2 / d)
    return base + ((i * 7919 + j * 104729) % 1000) / 1e5


def labels_of(m, d, dissent):
    """The Rust bench's pattern: dissent[j] teachers vote class ((j+1)*7919) % d, the rest 0."""
    labels = np.zeros(m, dtype=np.int64)
    at = 0
    for j, n in enumerate(dissent):
        labels[at:at + n] = ((j + 1) * 7919) % d
        at += n
    return labels


def answer(log_w, Y, secret, b, rng):
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mu = w @ Y
    X = np.sqrt(w)[:, None] * (Y - mu)
    _, S, Vt = np.linalg.svd(X, full_matrices=False)
    lam = S * S
    keep = lam > 0.0
    root = np.sqrt(lam[keep])
    V = Vt[keep]
    var = root * root.sum() / (2.0 * b)
    g = rng.standard_normal(len(var))
    r = Y[secret] + V.T @ (np.sqrt(var) * g)
    label = int(np.argmax(r))
    proj = (r - Y) @ V.T
    ll = -0.5 * (proj * proj / var).sum(axis=1)
    log_w = log_w + ll
    top = log_w.max()
    log_w -= top + np.log(np.exp(log_w - top).sum())
    return label, log_w


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, default=128)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--d", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--vector", action="store_true", help="also time vector mode on jittered scores")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    b = 2.0 ** -32
    for d in args.d:
        cases = [(name, np.eye(d)[labels_of(args.m, d, dissent)])
                 for name, dissent in PATTERNS.items() if len(dissent) + 1 <= d]
        if args.vector:
            cases.append(("vector_jittered", jittered_scores(args.m, d)))
        for name, Y in cases:
            start = rng.uniform(-8.0, 0.0, args.m)
            start -= start.max() + np.log(np.exp(start - start.max()).sum())
            batch = max(1, args.queries // 5)
            times = []
            for _ in range(5):
                log_w = start.copy()
                t0 = time.perf_counter()
                for _ in range(batch):
                    _, log_w = answer(log_w, Y, args.m - 1, b, rng)
                times.append((time.perf_counter() - t0) / batch)
            times.sort()
            print(json.dumps({"d": d, "pattern": name, "queries": 5 * batch, "ns_per_query": times[2] * 1e9}), flush=True)


if __name__ == "__main__":
    main()
