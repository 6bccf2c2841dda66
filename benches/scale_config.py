#!/usr/bin/env python3
"""Writes the config of a central egress gateway at scale: N Backends and N HTTPRoutes.

    benches/scale_config.py --backends 10000 --port 8080 OUT_DIR

Backend `b-00042` has two IP endpoints, 127.0.0.1 and 127.0.0.2, on `--port` (plaintext
HTTP/1.1: loopback only, so no packet ever leaves the machine); HTTPRoute `r-00042` sends
`Host: b-00042.scale.test` to it. `OUT_DIR/egressd.yaml` has the ProxyConfig (access log off,
admin on 127.0.0.1:0) and a Gateway listening on 127.0.0.1:0, as `benches/scale.sh` runs it;
`OUT_DIR/backends-NN.yaml` 1,000 Backends and their routes each (about 460 KB: a config file may
have at most 1 MiB unless `--max-config-file-size` says otherwise). Valid as written: `egressd
validate OUT_DIR`.
"""

import argparse
import os

HEADER = """\
apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  admin: {{address: "127.0.0.1:0"}}
  accessLog: {{enabled: false}}
  drain: {{timeout: 1s}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gateway}}
spec:
  listeners: [{{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}}]
"""

BACKEND = """\
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: b-{i:05d}}}
spec:
  destination:
    type: IP
    ip: {{endpoints: [{{address: 127.0.0.1}}, {{address: 127.0.0.2}}]}}
    ports: [{{number: {port}}}]
  protocol: HTTP11
  tls: {{mode: InsecureDisable}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r-{i:05d}}}
spec:
  parentRefs: [{{name: gateway}}]
  hostnames: [b-{i:05d}.scale.test]
  rules: [{{backendRefs: [{{name: b-{i:05d}}}]}}]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", type=int, default=10_000)
    parser.add_argument("--port", type=int, default=8080, help="the endpoints' port")
    parser.add_argument("--per-file", type=int, default=1_000, help="Backends per file")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    if not 1 <= args.backends <= 99_999:
        parser.error("--backends: 1 to 99999")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "egressd.yaml"), "w", encoding="utf-8") as out:
        out.write(HEADER.format())
    per_file = max(1, args.per_file)
    for first in range(0, args.backends, per_file):
        name = f"backends-{first // per_file:02d}.yaml"
        with open(os.path.join(args.out_dir, name), "w", encoding="utf-8") as out:
            for i in range(first, min(first + per_file, args.backends)):
                out.write(BACKEND.format(i=i, port=args.port))
    print(args.out_dir)


if __name__ == "__main__":
    main()
