"""grpcio peer of suite 08, run with the suite's venv (no protoc: a generic handler with raw
bytes).

    grpc_peer.py server PORTS_FILE CERT KEY   # h2c and TLS ports on 127.0.0.1, written as JSON
    grpc_peer.py served HOST:PORT             # how many Echo calls the server answered OK

`bench.Echo/Unary` echoes its message; `bench.Echo/Served` answers the count of Unary calls
answered so far, as decimal text (so a load run can be checked call by call: h2load sees only
`:status`, and a gRPC failure is a 200 too).
"""

import json
import os
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "bench.Echo"


def serve(ports_file, cert, key):
    served = [0]
    lock = threading.Lock()

    def unary(request, context):
        with lock:
            served[0] += 1
        return request

    def count(request, context):
        with lock:
            return str(served[0]).encode()

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Served": grpc.unary_unary_rpc_method_handler(count),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    h2c = server.add_insecure_port("127.0.0.1:0")
    with open(cert, "rb") as c, open(key, "rb") as k:
        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
    tls = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    tmp = ports_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"h2c": h2c, "tls": tls}, f)
    os.rename(tmp, ports_file)
    while True:
        time.sleep(3600)


def served(target):
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(f"/{SERVICE}/Served")
        print(int(call(b"", timeout=30)))


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(*sys.argv[2:5])
    elif sys.argv[1] == "served":
        served(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
