"""Tests of every meshwork_moto patch, run against a server at $MESHWORK_MOTO_ENDPOINT.

Each test asserts EC2's behaviour and fails against stock moto. Run with
``MESHWORK_MOTO_ENDPOINT=http://127.0.0.1:P python -m unittest -v test_meshwork_moto``.
Every test starts from ``POST /moto-api/reset``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time
import unittest
import urllib.request
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT = os.environ.get("MESHWORK_MOTO_ENDPOINT", "http://127.0.0.1:5000")
AMI = "ami-12345678"
# No retries (so injected faults and counters are exact) and a read timeout, so a server
# that spins (stock moto on exhaustion) fails the test instead of hanging the suite.
CLIENT_CONFIG = Config(
    retries={"total_max_attempts": 1, "mode": "standard"}, read_timeout=20, connect_timeout=5
)


def control(method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(ENDPOINT + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    return json.loads(text) if text.startswith(("{", "[")) else text


class MotoTestCase(unittest.TestCase):
    def setUp(self) -> None:
        control("POST", "/moto-api/reset")
        self.ec2 = boto3.client(
            "ec2",
            endpoint_url=ENDPOINT,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=CLIENT_CONFIG,
        )
        self.vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]

    # helpers

    def subnet(self, cidr: str) -> str:
        return self.ec2.create_subnet(VpcId=self.vpc, CidrBlock=cidr)["Subnet"]["SubnetId"]

    def instance(self, subnet: str, instance_type: str = "m5.large") -> str:
        run = self.ec2.run_instances(
            ImageId=AMI, MinCount=1, MaxCount=1, InstanceType=instance_type, SubnetId=subnet
        )
        return run["Instances"][0]["InstanceId"]

    def eni(self, subnet: str, **kwargs: Any) -> dict[str, Any]:
        return self.ec2.create_network_interface(SubnetId=subnet, **kwargs)["NetworkInterface"]

    def describe_eni(self, eni_id: str) -> dict[str, Any]:
        enis = self.ec2.describe_network_interfaces(NetworkInterfaceIds=[eni_id])
        return enis["NetworkInterfaces"][0]

    def assign(self, eni_id: str, **kwargs: Any) -> dict[str, Any]:
        return self.ec2.assign_private_ip_addresses(NetworkInterfaceId=eni_id, **kwargs)

    def attach(self, eni_id: str, instance_id: str, index: int) -> str:
        attached = self.ec2.attach_network_interface(
            NetworkInterfaceId=eni_id, InstanceId=instance_id, DeviceIndex=index
        )
        return attached["AttachmentId"]

    def primary_eni(self, instance_id: str) -> str:
        filters = [{"Name": "attachment.instance-id", "Values": [instance_id]}]
        enis = self.ec2.describe_network_interfaces(Filters=filters)["NetworkInterfaces"]
        return next(e["NetworkInterfaceId"] for e in enis if e["Attachment"]["DeviceIndex"] == 0)

    def available(self, subnet: str) -> int:
        subnets = self.ec2.describe_subnets(SubnetIds=[subnet])["Subnets"]
        return subnets[0]["AvailableIpAddressCount"]

    def subnet_addresses(self, subnet: str) -> list[str]:
        filters = [{"Name": "subnet-id", "Values": [subnet]}]
        enis = self.ec2.describe_network_interfaces(Filters=filters)["NetworkInterfaces"]
        return [a["PrivateIpAddress"] for e in enis for a in e["PrivateIpAddresses"]]

    def assertEc2Error(self, code: str, call: Any, *args: Any, **kwargs: Any) -> ClientError:
        with self.assertRaises(ClientError) as caught:
            call(*args, **kwargs)
        self.assertEqual(caught.exception.response["Error"]["Code"], code, caught.exception)
        return caught.exception


class AddressTests(MotoTestCase):
    def test_addresses_unique_across_subnet_and_not_reserved(self) -> None:
        subnet = self.subnet("10.0.1.0/27")  # 32 - 5 reserved = 27 usable
        self.instance(subnet)
        first = self.eni(subnet, SecondaryPrivateIpAddressCount=6)
        second = self.eni(subnet)
        self.ec2.assign_private_ip_addresses(
            NetworkInterfaceId=second["NetworkInterfaceId"], SecondaryPrivateIpAddressCount=6
        )
        self.ec2.assign_private_ip_addresses(
            NetworkInterfaceId=first["NetworkInterfaceId"], SecondaryPrivateIpAddressCount=3
        )
        self.instance(subnet)  # RunInstances draws from the same allocator
        taken = self.subnet_addresses(subnet)
        self.assertEqual(len(taken), 1 + 7 + 7 + 3 + 1)
        self.assertEqual(len(set(taken)), len(taken), f"duplicates in {sorted(taken)}")
        net = ipaddress.ip_network("10.0.1.0/27")
        forbidden = {net.network_address + i for i in range(4)} | {net.broadcast_address}
        for address in map(ipaddress.ip_address, taken):
            self.assertIn(address, net)
            self.assertNotIn(address, forbidden)
        self.assertEqual(self.available(subnet), 27 - len(taken))

    def test_concurrent_requests_get_distinct_addresses(self) -> None:
        subnet = self.subnet("10.0.16.0/26")
        errors: list[BaseException] = []

        def create() -> None:
            try:
                client = boto3.client(
                    "ec2",
                    endpoint_url=ENDPOINT,
                    region_name="us-east-1",
                    aws_access_key_id="testing",
                    aws_secret_access_key="testing",
                    config=CLIENT_CONFIG,
                )
                client.create_network_interface(SubnetId=subnet, SecondaryPrivateIpAddressCount=4)
            except BaseException as err:  # reported by the main thread
                errors.append(err)

        threads = [threading.Thread(target=create) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        self.assertEqual(errors, [])
        taken = self.subnet_addresses(subnet)
        self.assertEqual(len(taken), 8 * 5)
        self.assertEqual(len(set(taken)), len(taken), f"duplicates in {sorted(taken)}")
        self.assertEqual(self.available(subnet), 59 - 40)

    def test_exhaustion_fails_fast_and_count_never_negative(self) -> None:
        subnet = self.subnet("10.0.2.0/28")  # 11 usable
        eni = self.eni(subnet)["NetworkInterfaceId"]
        start = time.monotonic()
        self.assertEc2Error(
            "InsufficientFreeAddressesInSubnet",
            self.ec2.assign_private_ip_addresses,
            NetworkInterfaceId=eni,
            SecondaryPrivateIpAddressCount=20,
        )
        self.assertEc2Error(
            "InsufficientFreeAddressesInSubnet",
            self.ec2.create_network_interface,
            SubnetId=subnet,
            SecondaryPrivateIpAddressCount=20,
        )
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertEqual(self.available(subnet), 10, "a failed request must not hold addresses")
        self.assign(eni, SecondaryPrivateIpAddressCount=10)
        self.assertEqual(self.available(subnet), 0)
        self.assertEc2Error(
            "InsufficientFreeAddressesInSubnet",
            self.ec2.assign_private_ip_addresses,
            NetworkInterfaceId=eni,
            SecondaryPrivateIpAddressCount=1,
        )
        self.assertEc2Error("InsufficientFreeAddressesInSubnet", self.eni, subnet)
        self.assertEc2Error("InsufficientFreeAddressesInSubnet", self.instance, subnet)
        self.assertEqual(self.available(subnet), 0)

    def test_run_instances_is_all_or_nothing(self) -> None:
        subnet = self.subnet("10.0.18.0/28")  # 11 usable
        self.assertEc2Error(
            "InsufficientFreeAddressesInSubnet",
            self.ec2.run_instances,
            ImageId=AMI,
            MinCount=12,
            MaxCount=12,
            InstanceType="m5.large",
            SubnetId=subnet,
        )
        self.assertEqual(self.subnet_addresses(subnet), [])
        self.assertEqual(self.available(subnet), 11)

    def test_unassigned_addresses_are_free_again(self) -> None:
        subnet = self.subnet("10.0.3.0/28")
        eni = self.eni(subnet, SecondaryPrivateIpAddressCount=10)
        secondaries = [a["PrivateIpAddress"] for a in eni["PrivateIpAddresses"] if not a["Primary"]]
        self.assertEqual(self.available(subnet), 0)
        self.ec2.unassign_private_ip_addresses(
            NetworkInterfaceId=eni["NetworkInterfaceId"], PrivateIpAddresses=secondaries[:4]
        )
        self.assertEqual(self.available(subnet), 4)
        other = self.eni(subnet, SecondaryPrivateIpAddressCount=3)
        self.assertEqual(
            sorted(a["PrivateIpAddress"] for a in other["PrivateIpAddresses"]),
            sorted(secondaries[:4]),
        )

    def test_named_addresses_must_be_free_and_assignable(self) -> None:
        subnet = self.subnet("10.0.17.0/28")
        first = self.eni(subnet)
        second = self.eni(subnet)["NetworkInterfaceId"]
        self.assertEc2Error(
            "InvalidIPAddress.InUse",
            self.ec2.assign_private_ip_addresses,
            NetworkInterfaceId=second,
            PrivateIpAddresses=[first["PrivateIpAddress"]],
        )
        self.assertEc2Error(
            "InvalidParameterValue",
            self.ec2.assign_private_ip_addresses,
            NetworkInterfaceId=second,
            PrivateIpAddresses=["10.0.17.1"],
        )
        self.assertEc2Error(
            "InvalidIPAddress.InUse", self.eni, subnet, PrivateIpAddress=first["PrivateIpAddress"]
        )
        self.assign(second, PrivateIpAddresses=["10.0.17.9"])
        self.assertIn("10.0.17.9", self.subnet_addresses(subnet))


class LimitTests(MotoTestCase):
    def test_private_ip_limit_per_attached_eni(self) -> None:
        subnet = self.subnet("10.0.4.0/24")
        eni = self.primary_eni(self.instance(subnet))  # m5.large: 10 IPv4 per ENI
        self.assign(eni, SecondaryPrivateIpAddressCount=9)
        self.assertEc2Error(
            "PrivateIpAddressLimitExceeded",
            self.ec2.assign_private_ip_addresses,
            NetworkInterfaceId=eni,
            SecondaryPrivateIpAddressCount=1,
        )
        self.assertEqual(len(self.describe_eni(eni)["PrivateIpAddresses"]), 10)

    def test_attaching_an_eni_over_the_type_limit_fails(self) -> None:
        subnet = self.subnet("10.0.5.0/24")
        instance = self.instance(subnet, "t2.micro")  # 2 IPv4 per ENI
        eni = self.eni(subnet, SecondaryPrivateIpAddressCount=2)["NetworkInterfaceId"]
        self.assertEc2Error(
            "PrivateIpAddressLimitExceeded",
            self.ec2.attach_network_interface,
            NetworkInterfaceId=eni,
            InstanceId=instance,
            DeviceIndex=1,
        )

    def test_attachment_limit(self) -> None:
        subnet = self.subnet("10.0.6.0/24")
        instance = self.instance(subnet)  # m5.large: 3 ENIs
        for index in (1, 2):
            eni = self.eni(subnet)["NetworkInterfaceId"]
            self.attach(eni, instance, index)
        extra = self.eni(subnet)["NetworkInterfaceId"]
        self.assertEc2Error(
            "AttachmentLimitExceeded",
            self.ec2.attach_network_interface,
            NetworkInterfaceId=extra,
            InstanceId=instance,
            DeviceIndex=3,
        )

    def test_duplicate_device_index(self) -> None:
        subnet = self.subnet("10.0.7.0/24")
        instance = self.instance(subnet)
        first = self.eni(subnet)["NetworkInterfaceId"]
        second = self.eni(subnet)["NetworkInterfaceId"]
        self.attach(first, instance, 1)
        error = self.assertEc2Error(
            "InvalidParameterValue",
            self.ec2.attach_network_interface,
            NetworkInterfaceId=second,
            InstanceId=instance,
            DeviceIndex=1,
        )
        self.assertEqual(
            error.response["Error"]["Message"],
            f"Instance '{instance}' already has an interface attached at device index '1'.",
        )
        self.assertIn("interface attached at device", str(error))
        self.assertEqual(self.describe_eni(first)["Attachment"]["DeviceIndex"], 1)
        self.assertEqual(self.describe_eni(second)["Status"], "available")

    def test_delete_attached_eni_fails(self) -> None:
        subnet = self.subnet("10.0.8.0/24")
        instance = self.instance(subnet)
        eni = self.eni(subnet)["NetworkInterfaceId"]
        attachment = self.ec2.attach_network_interface(
            NetworkInterfaceId=eni, InstanceId=instance, DeviceIndex=1
        )["AttachmentId"]
        error = self.assertEc2Error(
            "InvalidNetworkInterface.InUse",
            self.ec2.delete_network_interface,
            NetworkInterfaceId=eni,
        )
        self.assertEqual(
            error.response["Error"]["Message"],
            f"The network interface '{eni}' is currently in use.",
        )
        self.ec2.detach_network_interface(AttachmentId=attachment)
        self.ec2.delete_network_interface(NetworkInterfaceId=eni)


class PrefixTests(MotoTestCase):
    def test_prefixes_aligned_disjoint_and_counted(self) -> None:
        subnet = self.subnet("10.0.9.0/26")  # /28 blocks .0 (reserved) .16 .32 .48 (broadcast)
        eni = self.eni(subnet, Ipv4PrefixCount=1)
        prefixes = [p["Ipv4Prefix"] for p in eni["Ipv4Prefixes"]]
        self.assertEqual(len(prefixes), 1)
        assigned = self.ec2.assign_private_ip_addresses(
            NetworkInterfaceId=eni["NetworkInterfaceId"], Ipv4PrefixCount=1
        )
        prefixes += [p["Ipv4Prefix"] for p in assigned["AssignedIpv4Prefixes"]]
        described_eni = self.describe_eni(eni["NetworkInterfaceId"])
        described = [p["Ipv4Prefix"] for p in described_eni["Ipv4Prefixes"]]
        self.assertEqual(sorted(described), sorted(prefixes))
        nets = [ipaddress.ip_network(p) for p in prefixes]
        self.assertEqual(sorted(map(str, nets)), ["10.0.9.16/28", "10.0.9.32/28"])
        self.assertEqual(self.available(subnet), 59 - 1 - 32)
        # single addresses go around the prefixes
        self.ec2.assign_private_ip_addresses(
            NetworkInterfaceId=eni["NetworkInterfaceId"], SecondaryPrivateIpAddressCount=10
        )
        for address in map(ipaddress.ip_address, self.subnet_addresses(subnet)):
            self.assertFalse(any(address in net for net in nets), address)
        self.assertEc2Error(
            "InsufficientCidrBlocks",
            self.ec2.assign_private_ip_addresses,
            NetworkInterfaceId=eni["NetworkInterfaceId"],
            Ipv4PrefixCount=1,
        )
        self.ec2.unassign_private_ip_addresses(
            NetworkInterfaceId=eni["NetworkInterfaceId"], Ipv4Prefixes=[prefixes[0]]
        )
        self.assertEqual(len(self.describe_eni(eni["NetworkInterfaceId"])["Ipv4Prefixes"]), 1)
        self.assertEqual(self.available(subnet), 59 - 11 - 16)
        again = self.ec2.assign_private_ip_addresses(
            NetworkInterfaceId=eni["NetworkInterfaceId"], Ipv4PrefixCount=1
        )
        self.assertEqual(again["AssignedIpv4Prefixes"], [{"Ipv4Prefix": prefixes[0]}])

    def test_prefix_counts_one_against_eni_limit(self) -> None:
        subnet = self.subnet("10.0.10.0/24")
        eni = self.primary_eni(self.instance(subnet))  # m5.large: 10 per ENI
        self.assign(eni, Ipv4PrefixCount=9)
        self.assertEqual(len(self.describe_eni(eni)["Ipv4Prefixes"]), 9)
        self.assertEc2Error(
            "PrivateIpAddressLimitExceeded",
            self.ec2.assign_private_ip_addresses,
            NetworkInterfaceId=eni,
            Ipv4PrefixCount=1,
        )
        self.assertEqual(self.available(subnet), 251 - 1 - 9 * 16)


class AttributeAndFilterTests(MotoTestCase):
    def test_device_index_filter(self) -> None:
        subnet = self.subnet("10.0.11.0/24")
        instance = self.instance(subnet)
        eni = self.eni(subnet)["NetworkInterfaceId"]
        self.attach(eni, instance, 2)
        filters = [
            {"Name": "attachment.instance-id", "Values": [instance]},
            {"Name": "attachment.device-index", "Values": ["2"]},
        ]
        found = self.ec2.describe_network_interfaces(Filters=filters)["NetworkInterfaces"]
        self.assertEqual([e["NetworkInterfaceId"] for e in found], [eni])

    def test_delete_on_termination_is_stored_and_honoured(self) -> None:
        subnet = self.subnet("10.0.12.0/24")
        instance = self.instance(subnet)
        kept = self.eni(subnet)["NetworkInterfaceId"]
        dropped = self.eni(subnet)["NetworkInterfaceId"]
        self.attach(kept, instance, 1)
        attachment = self.ec2.attach_network_interface(
            NetworkInterfaceId=dropped, InstanceId=instance, DeviceIndex=2
        )["AttachmentId"]
        self.ec2.modify_network_interface_attribute(
            NetworkInterfaceId=dropped,
            Attachment={"AttachmentId": attachment, "DeleteOnTermination": True},
        )
        self.assertTrue(self.describe_eni(dropped)["Attachment"]["DeleteOnTermination"])
        self.assertFalse(self.describe_eni(kept)["Attachment"]["DeleteOnTermination"])
        self.ec2.terminate_instances(InstanceIds=[instance])
        left = self.ec2.describe_network_interfaces()["NetworkInterfaces"]
        self.assertEqual(
            [(e["NetworkInterfaceId"], e["Status"]) for e in left], [(kept, "available")]
        )
        self.assertEqual(self.available(subnet), 251 - 1)


class PaginationTests(MotoTestCase):
    def collect(self, call: Any, key: str, id_of: Any, **kwargs: Any) -> tuple[list[str], int]:
        ids, pages, token = [], 0, None
        while True:
            args = dict(kwargs, MaxResults=5, **({"NextToken": token} if token else {}))
            answer = call(**args)
            pages += 1
            ids += id_of(answer[key])
            self.assertLessEqual(len(id_of(answer[key])), 5)
            token = answer.get("NextToken")
            if not token:
                return ids, pages

    def test_network_interfaces(self) -> None:
        subnet = self.subnet("10.0.13.0/24")
        made = {self.eni(subnet)["NetworkInterfaceId"] for _ in range(12)}
        ids, pages = self.collect(
            self.ec2.describe_network_interfaces,
            "NetworkInterfaces",
            lambda items: [e["NetworkInterfaceId"] for e in items],
        )
        self.assertEqual(pages, 3)
        self.assertEqual(sorted(ids), sorted(made))

    def test_subnets(self) -> None:
        made = {self.subnet(f"10.0.{20 + i}.0/24") for i in range(7)}
        filters = [{"Name": "vpc-id", "Values": [self.vpc]}]
        ids, pages = self.collect(
            self.ec2.describe_subnets,
            "Subnets",
            lambda items: [s["SubnetId"] for s in items],
            Filters=filters,
        )
        self.assertEqual(pages, 2)
        self.assertEqual(sorted(ids), sorted(made))

    def test_instances(self) -> None:
        subnet = self.subnet("10.0.14.0/24")
        run = self.ec2.run_instances(
            ImageId=AMI, MinCount=7, MaxCount=7, InstanceType="m5.large", SubnetId=subnet
        )
        made = {i["InstanceId"] for i in run["Instances"]}
        ids, pages = self.collect(
            self.ec2.describe_instances,
            "Reservations",
            lambda items: [i["InstanceId"] for r in items for i in r["Instances"]],
        )
        self.assertEqual(pages, 2)
        self.assertEqual(sorted(ids), sorted(made))

    def test_max_results_range(self) -> None:
        self.assertEc2Error("InvalidParameterValue", self.ec2.describe_subnets, MaxResults=2000)


class FaultTests(MotoTestCase):
    def test_error_rule_counts_and_clears(self) -> None:
        subnet = self.subnet("10.0.15.0/24")
        eni = self.eni(subnet)["NetworkInterfaceId"]
        rule = {
            "action": "AssignPrivateIpAddresses",
            "error": "RequestLimitExceeded",
            "status": 503,
            "count": 2,
        }
        control("POST", "/meshwork/faults", {"rules": [rule]})
        for _ in range(2):
            error = self.assertEc2Error(
                "RequestLimitExceeded",
                self.ec2.assign_private_ip_addresses,
                NetworkInterfaceId=eni,
                SecondaryPrivateIpAddressCount=1,
            )
            self.assertEqual(error.response["ResponseMetadata"]["HTTPStatusCode"], 503)
        self.assign(eni, SecondaryPrivateIpAddressCount=1)
        self.assertEqual(len(self.describe_eni(eni)["PrivateIpAddresses"]), 2)
        calls = control("GET", "/meshwork/calls")
        self.assertEqual(calls["AssignPrivateIpAddresses"], 3)
        self.assertEqual(calls["CreateNetworkInterface"], 1)
        control("POST", "/meshwork/faults", {"rules": [dict(rule, count=5)]})
        control("DELETE", "/meshwork/faults")
        self.assign(eni, SecondaryPrivateIpAddressCount=1)

    def test_delay_rule(self) -> None:
        rule = {"action": "DescribeSubnets", "delay_ms": 600, "count": 1}
        control("POST", "/meshwork/faults", {"rules": [rule]})
        start = time.monotonic()
        self.ec2.describe_subnets()
        self.assertGreaterEqual(time.monotonic() - start, 0.6)
        self.assertEqual(control("GET", "/meshwork/faults")["rules"], [])

    def test_reset_clears_faults_and_counters(self) -> None:
        rule = {"action": "DescribeVpcs", "error": "Unavailable", "status": 503, "count": 1}
        control("POST", "/meshwork/faults", {"rules": [rule]})
        control("POST", "/moto-api/reset")
        self.assertEqual(control("GET", "/meshwork/calls"), {})
        self.ec2.describe_vpcs()
        self.assertEqual(control("GET", "/meshwork/calls"), {"DescribeVpcs": 1})


if __name__ == "__main__":
    unittest.main()
