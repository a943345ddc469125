"""A gRPC client that no Meshwork code wrote: Python's grpcio, with stubs generated here
from proto/ by grpcio-tools, checks a running Meshwork server.

    python check_server.py --proto-dir proto --target unix:/run/meshwork/agent.sock agent
    python check_server.py --proto-dir proto --target 127.0.0.1:9890 operator --node node-1
    python check_server.py --proto-dir proto --target 127.0.0.1:9891 apiserver

It checks, through the standard clients, that every expected service is SERVING
(grpc_health.v1) and that reflection (v1alpha with grpcio-reflection's descriptor database,
and v1) lists exactly those services with the same methods as the stubs; then calls each
service's read RPCs (for the operator, the first snapshot of a WatchNode stream) and sends
malformed requests, which must get their error code with a message that says what is wrong
(none of them writes anything). One line per check; exit status 1 when any fails.
"""

import argparse
import importlib
import os
import subprocess
import sys
import tempfile

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

STANDARD = {
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}
TIMEOUT_S = 10
failures = []


def check(name, ok, detail=""):
    print(f"{'ok' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


def generate_stubs(proto_dir, out_dir):
    """Runs grpcio-tools' protoc over every .proto under proto_dir; returns the modules' dir."""
    files = []
    for root, _, names in os.walk(os.path.join(proto_dir, "meshwork")):
        files += [os.path.relpath(os.path.join(root, n), proto_dir) for n in names if n.endswith(".proto")]
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}",
         f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *sorted(files)],
        check=True,
    )
    sys.path.insert(0, out_dir)
    return files


def stubs(module):
    return importlib.import_module(module), importlib.import_module(module + "_grpc")


def expect_code(name, call, code, needle):
    """Calls `call`, which must fail with `code` and a message containing `needle`."""
    try:
        call()
    except grpc.RpcError as err:
        check(name, err.code() == code and needle in (err.details() or ""),
              f"{err.code().name}: {err.details()}")
        return
    check(name, False, f"succeeded; expected {code.name}")


def check_health(channel, services):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ["", *services]:
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        check(f"health {service or '(server)'}", status == "SERVING", status)
    expect_code("health of a service not served",
                lambda: health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"),
                                     timeout=TIMEOUT_S),
                grpc.StatusCode.NOT_FOUND, "")


def list_services_v1(channel):
    """grpc.reflection.v1 has the same messages as v1alpha, under another service name."""
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    reply = next(iter(call(iter([request]), timeout=TIMEOUT_S)))
    return {s.name for s in reply.list_services_response.service}


def check_reflection(channel, services, stub_modules):
    database = ProtoReflectionDescriptorDatabase(channel)
    expected = set(services) | STANDARD
    listed = set(database.get_services())
    check("reflection v1alpha lists the served services", listed == expected, str(sorted(listed)))
    listed_v1 = list_services_v1(channel)
    check("reflection v1 lists the served services", listed_v1 == expected, str(sorted(listed_v1)))
    pool = descriptor_pool.DescriptorPool(database)
    for service in services:
        reflected = pool.FindServiceByName(service)
        generated = None
        for module in stub_modules:
            generated = module.DESCRIPTOR.services_by_name.get(service.rsplit(".", 1)[1])
            if generated is not None and generated.full_name == service:
                break
        methods = sorted(m.name for m in reflected.methods)
        check(f"reflection describes {service}",
              generated is not None and methods == sorted(m.name for m in generated.methods),
              ", ".join(methods))


def check_agent(channel, args):
    agent_pb2, agent_grpc = stubs("meshwork.agent.v1.agent_pb2")
    datapath_pb2, datapath_grpc = stubs("meshwork.agent.v1.datapath_pb2")
    encrypt_pb2, encrypt_grpc = stubs("meshwork.agent.v1.encrypt_pb2")
    services = ["meshwork.agent.v1.Agent", "meshwork.agent.v1.Datapath", "meshwork.agent.v1.Encrypt"]
    check_health(channel, services)
    check_reflection(channel, services, [agent_pb2, datapath_pb2, encrypt_pb2])

    agent = agent_grpc.AgentStub(channel)
    status = agent.Status(agent_pb2.StatusRequest(), timeout=TIMEOUT_S)
    mesh = status.clustermesh
    check("Agent.Status", mesh.total == args.clusters and mesh.ready == args.clusters
          and status.HasField("datapath"), f"{mesh.ready}/{mesh.total} ready")
    waited = agent.WaitSynced(agent_pb2.WaitSyncedRequest(timeout_ms=5000), timeout=TIMEOUT_S)
    check("Agent.WaitSynced", not waited.breaker_fired, f"{waited.waited_ms} ms")
    expect_code("Agent.WaitSynced with an unknown kind",
                lambda: agent.WaitSynced(agent_pb2.WaitSyncedRequest(kinds=[42]), timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, "unknown sync kind 42")
    expect_code("Agent.WaitSynced with an unspecified kind",
                lambda: agent.WaitSynced(agent_pb2.WaitSyncedRequest(kinds=[0]), timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, "unknown sync kind 0")

    datapath = datapath_grpc.DatapathStub(channel)
    listed = datapath.ListEndpoints(datapath_pb2.ListEndpointsRequest(), timeout=TIMEOUT_S)
    check("Datapath.ListEndpoints", True, f"{len(listed.endpoints)} endpoints")
    bad = datapath_pb2.Endpoint(id=7, interface="lxc7", identity=1000, ips=["not-an-ip"])
    expect_code("Datapath.PutEndpoint with an unparsable IP",
                lambda: datapath.PutEndpoint(datapath_pb2.PutEndpointRequest(endpoint=bad),
                                             timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, 'unparsable IP "not-an-ip"')
    expect_code("Datapath.PutEndpoint without an endpoint",
                lambda: datapath.PutEndpoint(datapath_pb2.PutEndpointRequest(), timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, "missing endpoint")
    after = datapath.ListEndpoints(datapath_pb2.ListEndpointsRequest(), timeout=TIMEOUT_S)
    check("a refused endpoint is not stored", len(after.endpoints) == len(listed.endpoints))

    encrypt = encrypt_grpc.EncryptStub(channel)
    expect_code("Encrypt.Status without WireGuard",
                lambda: encrypt.Status(encrypt_pb2.EncryptStatusRequest(), timeout=TIMEOUT_S),
                grpc.StatusCode.FAILED_PRECONDITION, "--enable-wireguard")


def check_operator(channel, args):
    ipam_pb2, ipam_grpc = stubs("meshwork.ipam.v1.ipam_pb2")
    services = ["meshwork.ipam.v1.NodeIpam"]
    check_health(channel, services)
    check_reflection(channel, services, [ipam_pb2])
    ipam = ipam_grpc.NodeIpamStub(channel)
    # A server stream: the node's latest snapshot comes at once; take it and hang up.
    watch = ipam.WatchNode(ipam_pb2.WatchNodeRequest(node=args.node), timeout=TIMEOUT_S)
    snapshot = next(watch)
    watch.cancel()
    enis = {eni.id for eni in snapshot.enis}
    check("NodeIpam.WatchNode", snapshot.node == args.node and len(snapshot.pool) > 0
          and all(ip.resource in enis for ip in snapshot.pool),
          f"{len(snapshot.pool)} pool IPs on {len(enis)} ENIs, generation {snapshot.generation}")
    expect_code("NodeIpam.WatchNode with an invalid name",
                lambda: next(ipam.WatchNode(ipam_pb2.WatchNodeRequest(node="Not A Node"),
                                            timeout=TIMEOUT_S)),
                grpc.StatusCode.INVALID_ARGUMENT, "is not a CiliumNode name")
    expect_code("NodeIpam.WatchNode of an unknown node",
                lambda: next(ipam.WatchNode(ipam_pb2.WatchNodeRequest(node="no-such-node"),
                                            timeout=TIMEOUT_S)),
                grpc.StatusCode.NOT_FOUND, "no-such-node")
    bad_answer = ipam_pb2.ReportUsageRequest(node=args.node, generation=snapshot.generation,
                                             release_answers={snapshot.pool[0].ip: "maybe"})
    expect_code("NodeIpam.ReportUsage with a bad answer",
                lambda: ipam.ReportUsage(bad_answer, timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, '"maybe"')
    expect_code("NodeIpam.ReportUsage of a generation never published",
                lambda: ipam.ReportUsage(ipam_pb2.ReportUsageRequest(node=args.node, generation="0"),
                                         timeout=TIMEOUT_S),
                grpc.StatusCode.FAILED_PRECONDITION, snapshot.generation)
    expect_code("NodeIpam.RegisterNode without an instance",
                lambda: ipam.RegisterNode(ipam_pb2.RegisterNodeRequest(node=args.node),
                                          timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, "instance_id")


def check_apiserver(channel, args):
    export_pb2, export_grpc = stubs("meshwork.apiserver.v1.export_pb2")
    services = ["meshwork.apiserver.v1.Export"]
    check_health(channel, services)
    check_reflection(channel, services, [export_pb2])
    export = export_grpc.ExportStub(channel)
    listed = export.ListServices(export_pb2.ListServicesRequest(), timeout=TIMEOUT_S)
    check("Export.ListServices", True, f"{len(listed.services)} services")
    bad = export_pb2.Service(namespace="default", name="web", frontends=["not-an-ip"], shared=True)
    expect_code("Export.PutService with an unparsable frontend",
                lambda: export.PutService(export_pb2.PutServiceRequest(service=bad), timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, 'frontend "not-an-ip" is not an IP address')
    expect_code("Export.DeleteNode with an invalid name",
                lambda: export.DeleteNode(export_pb2.DeleteNodeRequest(name="Not A Node"), timeout=TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT, 'node name "Not A Node"')
    after = export.ListServices(export_pb2.ListServicesRequest(), timeout=TIMEOUT_S)
    check("a refused service is not declared", len(after.services) == len(listed.services))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proto-dir", required=True, help="the directory holding meshwork/")
    parser.add_argument("--target", required=True, help="unix:PATH or HOST:PORT")
    components = parser.add_subparsers(dest="component", required=True)
    agent = components.add_parser("agent", help="meshwork-agent's unix socket")
    agent.add_argument("--clusters", type=int, default=1, help="remote clusters configured")
    operator = components.add_parser("operator", help="meshwork-operator's gRPC endpoint")
    operator.add_argument("--node", required=True, help="a node the operator has published")
    components.add_parser("apiserver", help="meshwork-apiserver's gRPC endpoint")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        generate_stubs(args.proto_dir, out)
        # On a unix socket grpc-core sends the socket path as :authority, which HTTP/2 (and
        # so the Rust servers) reject; "localhost" is the convention grpc-go and Kubernetes use.
        options = [("grpc.default_authority", "localhost")] if args.target.startswith("unix:") else []
        with grpc.insecure_channel(args.target, options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
            checks = {"agent": check_agent, "operator": check_operator, "apiserver": check_apiserver}
            checks[args.component](channel, args)
    if failures:
        print(f"{len(failures)} checks failed: {', '.join(failures)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
