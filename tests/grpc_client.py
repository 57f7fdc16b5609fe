"""Shared pieces of the gRPC tests: Python stubs generated from proto/specd.proto at run time
(protoc + grpc_python_plugin, into a temporary folder), message classes for grpc.health.v1
and server reflection built from descriptors (Debian ships no Python stubs for them), and
`specd serve` on free loopback ports. Needs Debian's python3-grpcio and python3-protobuf.
"""
import atexit
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import daemon  # tests/daemon.py (stdlib only): its /metrics parser


def build_stubs(source, protoc, plugin):
    """(specd_pb2, specd_pb2_grpc) generated from SOURCE/proto/specd.proto."""
    out = tempfile.mkdtemp(prefix="specd_grpc_stubs_")
    atexit.register(shutil.rmtree, out, True)
    subprocess.run([protoc, f"-I{source}/proto", f"--python_out={out}",
                    f"--grpc_python_out={out}", f"--plugin=protoc-gen-grpc_python={plugin}",
                    f"{source}/proto/specd.proto"], check=True)
    sys.path.insert(0, out)
    import specd_pb2
    import specd_pb2_grpc
    return specd_pb2, specd_pb2_grpc


def _message_classes(package, messages):
    """Message classes from {name: [(field, number, type, label, type_name)]} (proto2, so a
    set empty string is still sent, as the reflection oneof needs)."""
    f = descriptor_pb2.FileDescriptorProto(name=f"{package}.test.proto", package=package,
                                           syntax="proto2")
    for name, fields in messages.items():
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = f".{package}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    get = getattr(message_factory, "GetMessageClass", None)
    out = {}
    for name in messages:
        d = pool.FindMessageTypeByName(f"{package}.{name}")
        out[name] = get(d) if get else factory.GetPrototype(d)
    return out


F = descriptor_pb2.FieldDescriptorProto
OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
HEALTH = _message_classes("grpc.health.v1", {
    "HealthCheckRequest": [("service", 1, F.TYPE_STRING, OPT, None)],
    "HealthCheckResponse": [("status", 1, F.TYPE_INT32, OPT, None)],  # 1 SERVING, 2 NOT_SERVING
})
REFLECTION = _message_classes("grpc.reflection.v1alpha", {
    "ServerReflectionRequest": [("host", 1, F.TYPE_STRING, OPT, None),
                                ("file_containing_symbol", 4, F.TYPE_STRING, OPT, None),
                                ("list_services", 7, F.TYPE_STRING, OPT, None)],
    "FileDescriptorResponse": [("file_descriptor_proto", 1, F.TYPE_BYTES, REP, None)],
    "ServiceResponse": [("name", 1, F.TYPE_STRING, OPT, None)],
    "ListServiceResponse": [("service", 1, F.TYPE_MESSAGE, REP, "ServiceResponse")],
    "ErrorResponse": [("error_code", 1, F.TYPE_INT32, OPT, None),
                      ("error_message", 2, F.TYPE_STRING, OPT, None)],
    "ServerReflectionResponse": [
        ("valid_host", 1, F.TYPE_STRING, OPT, None),
        ("file_descriptor_response", 4, F.TYPE_MESSAGE, OPT, "FileDescriptorResponse"),
        ("list_services_response", 6, F.TYPE_MESSAGE, OPT, "ListServiceResponse"),
        ("error_response", 7, F.TYPE_MESSAGE, OPT, "ErrorResponse")],
})
SERVING, NOT_SERVING = 1, 2


class Daemon:
    """`specd serve` on free loopback ports; stderr is drained in the background."""

    def __init__(self, specd, model, *extra):
        self.proc = subprocess.Popen(
            [specd, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
             "--grpc-port", "0", "--threads", "2", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.terminated = False
        ready = threading.Event()
        self.grpc_address = None
        self.http_address = None

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                if line.startswith("specd: listening"):
                    fields = dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)
                    self.grpc_address = fields.get("grpc")
                    self.http_address = fields.get("http")
                    ready.set()
            ready.set()

        self.drainer = threading.Thread(target=drain, daemon=True)
        self.drainer.start()
        if not ready.wait(120) or self.grpc_address in (None, "off"):
            self.proc.kill()
            raise RuntimeError("specd serve did not come up:\n" + "".join(self.lines[-30:]))

    def rss_bytes(self):
        """The daemon's resident set size now."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def metrics(self):
        """GET /metrics: {'name' or 'name{label="v",...}': value}."""
        with urllib.request.urlopen(f"http://{self.http_address}/metrics", timeout=30) as r:
            return daemon.parse_metrics(r.read().decode())

    def log(self):
        return "".join(self.lines[-40:])

    def terminate(self):
        """SIGTERM once: the daemon drains and exits."""
        if not self.terminated and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.terminated = True

    def stop(self, timeout=60):
        self.terminate()
        code = self.proc.wait(timeout)
        self.drainer.join(10)
        if not self.drainer.is_alive():
            self.proc.stderr.close()
        return code
