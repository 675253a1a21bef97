"""Train m teachers on the subsets written by `pacpriv subsets` and serve
them from one Seldon MLServer process, over the Open Inference Protocol.

    pacpriv subsets --n 1500 --m 8 --seed 7 --out subsets.json
    python examples/mlserver/teachers.py --subsets subsets.json \
        --repository ./teachers --grpc-port 8081 --config teachers.toml
    pacpriv serve --config teachers.toml

The universe U is the first N rows of scikit-learn's bundled optical-digits
data (8x8 images, pixel counts 0-16, 10 classes); teacher i is a logistic
regression trained on the rows of subset S_i only, saved with joblib and
served by MLServer's scikit-learn runtime as the model `teacher-i`
(version 1, output `predict`: the label). The rows after N are held out:
`--holdout FILE` writes them with every teacher's own label, for checking
what comes back through pacpriv.

`--config FILE` writes the `[model]` and `[teachers]` sections `pacpriv
serve` needs to fan out to these models. The script then replaces itself
with `mlserver start` (unless `--no-serve`), so stopping it stops MLServer.
"""
import argparse
import json
import os
import pathlib
import shutil
import sys

import joblib
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subsets", required=True, help="pacpriv-subsets/v1 JSON from `pacpriv subsets`")
    ap.add_argument("--repository", required=True, help="model repository directory to (re)create")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--grpc-port", type=int, default=8081)
    ap.add_argument("--http-port", type=int, default=8080)
    ap.add_argument("--metrics-port", type=int, default=8082)
    ap.add_argument("--config", help="write pacpriv's [model] and [teachers] sections here")
    ap.add_argument("--holdout", help="write held-out rows and each teacher's label here (JSON)")
    ap.add_argument("--no-serve", action="store_true", help="train and write only")
    args = ap.parse_args()

    assignment = json.loads(pathlib.Path(args.subsets).read_text())
    if assignment.get("format") != "pacpriv-subsets/v1":
        sys.exit(f"{args.subsets}: not a pacpriv-subsets/v1 file")
    n, m, subsets = assignment["n"], assignment["m"], assignment["subsets"]
    digits = load_digits()
    x, y = digits.data.astype(np.float64), digits.target.astype(np.int64)
    if n >= len(x):
        sys.exit(f"--n {n} leaves no held-out rows: the digits data has {len(x)}")

    repo = pathlib.Path(args.repository)
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    # One process, models loaded in it: parallel workers would each load all
    # m models (MLServer's default is one worker process).
    settings = {
        "host": args.host,
        "grpc_port": args.grpc_port,
        "http_port": args.http_port,
        "metrics_port": args.metrics_port,
        "parallel_workers": 0,
        "load_models_at_startup": True,
        "debug": False,
    }
    (repo / "settings.json").write_text(json.dumps(settings, indent=2))

    held_out = x[n:]
    labels = np.empty((len(held_out), m), dtype=np.int64)
    for i, rows in enumerate(subsets):
        model = LogisticRegression(max_iter=2000).fit(x[rows], y[rows])
        labels[:, i] = model.predict(held_out)
        d = repo / f"teacher-{i}"
        d.mkdir()
        joblib.dump(model, d / "model.joblib")
        (d / "model-settings.json").write_text(json.dumps({
            "name": f"teacher-{i}",
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": "./model.joblib", "version": "1"},
        }, indent=2))
    agree = float(np.mean([np.bincount(r).max() == m for r in labels]))
    print(f"trained {m} teachers on {n} points; {agree:.0%} of {len(held_out)} held-out rows unanimous", file=sys.stderr)

    if args.holdout:
        pathlib.Path(args.holdout).write_text(json.dumps({
            "features": held_out.tolist(), "labels": y[n:].tolist(), "teacher_labels": labels.tolist(),
        }))
    if args.config:
        endpoint = f"http://{args.host}:{args.grpc_port}"
        lines = ["[model]", 'mode = "label"', "classes = 10", "input_shape = [64]", "",
                 "[teachers]", 'source = "remote"', 'output_name = "predict"', "remote = ["]
        lines += [f'  {{ endpoint = "{endpoint}", model = "teacher-{i}", version = "1" }},' for i in range(m)]
        lines += ["]", ""]
        pathlib.Path(args.config).write_text("\n".join(lines))
    if not args.no_serve:
        mlserver = shutil.which("mlserver") or str(pathlib.Path(sys.executable).with_name("mlserver"))
        sys.stdout.flush()
        os.execv(mlserver, [mlserver, "start", str(repo)])


if __name__ == "__main__":
    main()
