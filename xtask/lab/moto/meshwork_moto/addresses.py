"""Subnet address accounting: unique addresses, aligned /28 prefixes, real free counts.

Nothing here is cached: what is in use is read from moto's live objects (every ENI's
addresses and prefixes, plus non-instance holders in ``Subnet._subnet_ips`` such as EFS
mount targets) on each call, so ``POST /moto-api/reset`` and deletions free addresses
without any bookkeeping of ours that could drift.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.instances import Instance, InstanceBackend
from moto.ec2.models.subnets import Subnet

# AWS reserves the network address, .1 (router), .2 (DNS), .3 (future) and the broadcast.
RESERVED_AT_START = 4
PREFIX_LEN = 28
PREFIX_SIZE = 1 << (32 - PREFIX_LEN)


class InsufficientFreeAddresses(EC2ClientError):
    def __init__(self) -> None:
        super().__init__(
            "InsufficientFreeAddressesInSubnet",
            "The specified subnet does not have enough free addresses to satisfy the request.",
        )


class InsufficientCidrBlocks(EC2ClientError):
    def __init__(self) -> None:
        super().__init__(
            "InsufficientCidrBlocks",
            "The specified subnet does not have enough free cidr blocks to satisfy the request.",
        )


def is_ipv4(subnet: Any) -> bool:
    return isinstance(getattr(subnet, "cidr", None), ipaddress.IPv4Network)


def eni_prefixes(eni: Any) -> list[str]:
    """The /28 prefixes delegated to an ENI (our attribute; absent on stock ENIs)."""
    prefixes: list[str] = eni.__dict__.setdefault("meshwork_prefixes", [])
    return prefixes


def _ints_of_prefix(prefix: str) -> range:
    net = ipaddress.IPv4Network(prefix)
    start = int(net.network_address)
    return range(start, start + net.num_addresses)


def _subnet_enis(subnet: Subnet) -> Iterable[Any]:
    return (e for e in subnet.ec2_backend.enis.values() if e.subnet.id == subnet.id)


def used_addresses(subnet: Subnet) -> set[int]:
    """Every IPv4 address held in the subnet by an ENI (addresses and prefixes) or by a
    non-instance user of the subnet. Instance primaries are counted through their ENI, so a
    terminated instance does not keep its address forever."""
    used: set[int] = set()
    for eni in _subnet_enis(subnet):
        for item in eni.private_ip_addresses:
            used.add(int(ipaddress.IPv4Address(item["PrivateIpAddress"])))
        for prefix in eni_prefixes(eni):
            used.update(_ints_of_prefix(prefix))
    for ip, owner in subnet._subnet_ips.items():
        if not isinstance(owner, Instance):
            used.add(int(ipaddress.IPv4Address(ip)))
    return used


def _bounds(subnet: Subnet) -> tuple[int, int]:
    """First and last address (inclusive) that AWS may hand out in the subnet."""
    net = subnet.cidr
    return int(net.network_address) + RESERVED_AT_START, int(net.broadcast_address) - 1


def _unavailable(subnet: Subnet, extra: Iterable[int] = ()) -> set[int]:
    reserved = {int(ip) for ip in subnet._reserved_ips if ip.version == 4}
    return used_addresses(subnet) | reserved | set(extra)


def in_use_by_eni(subnet: Subnet, address: str) -> bool:
    """Whether an ENI already holds `address` (as an address or inside a prefix)."""
    value = int(ipaddress.IPv4Address(address))
    for eni in _subnet_enis(subnet):
        if any(item["PrivateIpAddress"] == address for item in eni.private_ip_addresses):
            return True
        if any(value in _ints_of_prefix(p) for p in eni_prefixes(eni)):
            return True
    return False


def assignable(subnet: Subnet, address: str) -> bool:
    """Whether `address` lies in the part of the subnet AWS lets one assign."""
    first, last = _bounds(subnet)
    return first <= int(ipaddress.IPv4Address(address)) <= last


def allocate_addresses(subnet: Subnet, count: int, exclude: Iterable[str] = ()) -> list[str]:
    """The `count` lowest free addresses, or InsufficientFreeAddressesInSubnet at once.
    A bounded scan: it can never spin the way stock moto's random retry loop does."""
    if count <= 0:
        return []
    taken = _unavailable(subnet, (int(ipaddress.IPv4Address(a)) for a in exclude))
    first, last = _bounds(subnet)
    found: list[str] = []
    for value in range(first, last + 1):
        if value not in taken:
            found.append(str(ipaddress.IPv4Address(value)))
            if len(found) == count:
                return found
    raise InsufficientFreeAddresses()


def allocate_prefixes(subnet: Subnet, count: int, exclude: Iterable[str] = ()) -> list[str]:
    """`count` free /28 prefixes aligned on /28 boundaries, lowest first, or
    InsufficientCidrBlocks. A block is free only if none of its 16 addresses is used or
    reserved, so the blocks holding the network and broadcast addresses never qualify."""
    if count <= 0:
        return []
    taken = _unavailable(subnet, (int(ipaddress.IPv4Address(a)) for a in exclude))
    net = subnet.cidr
    found: list[str] = []
    if net.prefixlen > PREFIX_LEN:
        raise InsufficientCidrBlocks()
    for block in net.subnets(new_prefix=PREFIX_LEN):
        start = int(block.network_address)
        if block.broadcast_address == net.broadcast_address or start == int(net.network_address):
            continue
        if not any(v in taken for v in range(start, start + PREFIX_SIZE)):
            found.append(str(block))
            if len(found) == count:
                return found
    raise InsufficientCidrBlocks()


def available_count(subnet: Subnet) -> int:
    """EC2's AvailableIpAddressCount: usable addresses minus those held; never negative.
    `_available_ip_addresses` is moto's size-minus-5 (less prefix-type CIDR reservations)."""
    first, last = _bounds(subnet)
    held = sum(1 for v in used_addresses(subnet) if first <= v <= last)
    return max(0, subnet._available_ip_addresses - held)


_stock_available_count = Subnet.available_ip_address_count
_stock_get_available_subnet_ip = Subnet.get_available_subnet_ip


def _patched_available_count(self: Subnet) -> int:
    if not is_ipv4(self):
        return _stock_available_count.fget(self)
    return available_count(self)


def _patched_get_available_subnet_ip(self: Subnet, instance: Any) -> str:
    """Instance primaries (and EFS / Route 53 resolver addresses) come from the same
    allocator as ENI addresses; stock walked its own cursor and collided with ENIs."""
    if not is_ipv4(self):
        return _stock_get_available_subnet_ip(self, instance)
    ip = allocate_addresses(self, 1)[0]
    self._subnet_ips[ip] = instance
    return ip


_stock_run_instances = InstanceBackend.run_instances


def _patched_run_instances(
    self: Any, image_id: str, count: int, user_data: Any, groups: list[str], **kwargs: Any
) -> Any:
    """All or nothing, as in EC2: stock created instances one by one and, when the subnet
    ran out half-way, left the first ones' ENIs behind without a reservation."""
    subnet_id = kwargs.get("subnet_id")
    if subnet_id:
        subnet = self.get_subnet(subnet_id)
        if is_ipv4(subnet) and available_count(subnet) < int(count):
            raise InsufficientFreeAddresses()
    return _stock_run_instances(self, image_id, count, user_data, groups, **kwargs)


def apply() -> None:
    InstanceBackend.run_instances = _patched_run_instances
    Subnet.available_ip_address_count = property(_patched_available_count)
    Subnet.get_available_subnet_ip = _patched_get_available_subnet_ip
