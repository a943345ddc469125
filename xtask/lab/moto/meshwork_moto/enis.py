"""Network-interface patches: allocation, prefixes, limits, attach/delete rules, attributes."""

from __future__ import annotations

from typing import Any

from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.exceptions import (
    EC2ClientError,
    InvalidNetworkAttachmentIdError,
    InvalidParameterCombination,
)
from moto.ec2.models.elastic_network_interfaces import (
    NetworkInterface,
    NetworkInterfaceBackend,
)
from moto.ec2.models.instance_types import INSTANCE_TYPES
from moto.ec2.models.instances import Instance
from moto.ec2.responses.elastic_network_interfaces import ElasticNetworkInterfaces
from moto.ec2.utils import add_tag_specification

from . import addresses
from .addresses import eni_prefixes

# An unattached ENI belongs to no instance type, so EC2 cannot apply a type's limit yet;
# we allow the largest per-interface IPv4 limit of any type and check the real type's
# limit when the ENI is attached (see _check_attach).
MAX_IPV4_PER_ENI = max(
    t.get("NetworkInfo", {}).get("Ipv4AddressesPerInterface", 0) for t in INSTANCE_TYPES.values()
)


def _network_info(instance: Instance) -> dict[str, Any]:
    info: dict[str, Any] = INSTANCE_TYPES.get(instance.instance_type, {}).get("NetworkInfo", {})
    return info


def ipv4_limit(eni: NetworkInterface) -> int:
    """IPv4 addresses (prefixes count as one each) the ENI may hold."""
    if eni.instance is None:
        return MAX_IPV4_PER_ENI
    return int(_network_info(eni.instance).get("Ipv4AddressesPerInterface", MAX_IPV4_PER_ENI))


def ipv4_held(eni: NetworkInterface) -> int:
    return len(eni.private_ip_addresses) + len(eni_prefixes(eni))


def _limit_error() -> EC2ClientError:
    return EC2ClientError(
        "PrivateIpAddressLimitExceeded", "Number of private addresses will exceed limit."
    )


def _in_use_error(address: str) -> EC2ClientError:
    return EC2ClientError("InvalidIPAddress.InUse", f"The address {address} is already in use.")


def _explicit_addresses(primary: Any, listed: list[Any] | None) -> list[str]:
    """Addresses the caller named: the primary (a string or a one-item list) and the
    PrivateIpAddresses items (strings or {'PrivateIpAddress': ..} dicts)."""
    named = list(primary) if isinstance(primary, list) else [primary]
    for item in listed or []:
        named.append(item.get("PrivateIpAddress") if isinstance(item, dict) else item)
    return [a for a in named if a]


# --- CreateNetworkInterface ------------------------------------------------------------

_stock_create = NetworkInterfaceBackend.create_network_interface


def create_network_interface(
    self: Any,
    subnet: Any,
    private_ip_address: Any,
    private_ip_addresses: list[Any] | None = None,
    group_ids: list[str] | None = None,
    description: str | None = None,
    tags: dict[str, str] | None = None,
    delete_on_termination: bool | None = False,
    **kwargs: Any,
) -> NetworkInterface:
    """Picks the primary and secondary addresses (and prefixes) from the subnet allocator
    before building the ENI, so the constructor never draws random addresses."""
    subnet_obj = self.get_subnet(subnet) if isinstance(subnet, str) else subnet
    count = int(kwargs.pop("secondary_ips_count", None) or 0)
    prefix_count = int(kwargs.pop("ipv4_prefix_count", None) or 0)
    if not addresses.is_ipv4(subnet_obj):
        return _stock_create(
            self, subnet, private_ip_address, private_ip_addresses, group_ids,
            description, tags, delete_on_termination, secondary_ips_count=count, **kwargs,
        )
    named = _explicit_addresses(private_ip_address, private_ip_addresses)
    for address in named:
        if addresses.in_use_by_eni(subnet_obj, address):
            raise _in_use_error(address)
    if (1 if not named else len(named)) + count + prefix_count > MAX_IPV4_PER_ENI:
        raise _limit_error()
    fresh = addresses.allocate_addresses(subnet_obj, (0 if named else 1) + count, exclude=named)
    prefixes = addresses.allocate_prefixes(subnet_obj, prefix_count, exclude=named + fresh)
    primary = private_ip_address if named else fresh.pop(0)
    eni = _stock_create(
        self, subnet_obj, primary, private_ip_addresses, group_ids, description, tags,
        delete_on_termination, **kwargs,
    )
    eni.private_ip_addresses.extend({"Primary": False, "PrivateIpAddress": ip} for ip in fresh)
    eni_prefixes(eni).extend(prefixes)
    return eni


def create_network_interface_response(self: ElasticNetworkInterfaces) -> ActionResult:
    """Stock handler plus Ipv4PrefixCount (stock accepted and ignored it)."""
    count = self._get_int_param("SecondaryPrivateIpAddressCount", 0)
    prefix_count = self._get_int_param("Ipv4PrefixCount", 0)
    if count and prefix_count:
        raise InvalidParameterCombination(
            "You cannot specify both SecondaryPrivateIpAddressCount and Ipv4PrefixCount."
        )
    ipv6 = [i["Ipv6Address"] for i in self._get_param("Ipv6Addresses", [])]
    tags = add_tag_specification(self._get_param("TagSpecifications", []))
    self.error_on_dryrun()
    eni = self.ec2_backend.create_network_interface(
        self.ec2_backend.get_subnet(self._get_param("SubnetId")),
        self._get_param("PrivateIpAddress"),
        self._get_param("PrivateIpAddresses", []),
        self._get_param("Groups", []),
        self._get_param("Description"),
        tags,
        secondary_ips_count=count,
        ipv4_prefix_count=prefix_count,
        ipv6_addresses=ipv6,
        ipv6_address_count=self._get_int_param("Ipv6AddressCount", 0),
    )
    return ActionResult({"NetworkInterface": eni})


# --- Assign / Unassign -----------------------------------------------------------------


def assign(
    backend: Any, eni_id: str, named: list[str], count: int, prefix_count: int
) -> tuple[NetworkInterface, list[str], list[str]]:
    """Adds addresses and prefixes to an ENI; returns it with what was newly assigned.
    The per-ENI limit is checked first, then the subnet's free space (both fail at once)."""
    eni = backend.get_network_interface(eni_id)
    if count and prefix_count:
        raise InvalidParameterCombination(
            "You cannot specify both SecondaryPrivateIpAddressCount and Ipv4PrefixCount."
        )
    if ipv4_held(eni) + len(named) + count + prefix_count > ipv4_limit(eni):
        raise _limit_error()
    subnet = eni.subnet
    for address in named:
        if not addresses.assignable(subnet, address):
            raise EC2ClientError(
                "InvalidParameterValue", f"Address {address} is not in subnet {subnet.id}'s range."
            )
        if addresses.in_use_by_eni(subnet, address):
            raise _in_use_error(address)
    fresh = named + addresses.allocate_addresses(subnet, count, exclude=named)
    prefixes = addresses.allocate_prefixes(subnet, prefix_count, exclude=fresh)
    eni.private_ip_addresses.extend({"Primary": False, "PrivateIpAddress": ip} for ip in fresh)
    eni_prefixes(eni).extend(prefixes)
    return eni, fresh, prefixes


def assign_private_ip_addresses(
    self: Any,
    eni_id: str,
    private_ip_addresses: list[str] | None = None,
    secondary_ips_count: int | None = None,
) -> NetworkInterface:
    """Backend entry kept for other moto callers; stock looped on random addresses."""
    named = list(private_ip_addresses or [])
    return assign(self, eni_id, named, int(secondary_ips_count or 0), 0)[0]


def assign_response(self: ElasticNetworkInterfaces) -> ActionResult:
    """Returns only what this call assigned, as EC2 does (stock returned every address)."""
    _, ips, prefixes = assign(
        self.ec2_backend,
        self._get_param("NetworkInterfaceId"),
        list(self._get_param("PrivateIpAddresses", [])),
        self._get_int_param("SecondaryPrivateIpAddressCount", 0),
        self._get_int_param("Ipv4PrefixCount", 0),
    )
    return ActionResult(
        {
            "NetworkInterfaceId": self._get_param("NetworkInterfaceId"),
            "AssignedPrivateIpAddresses": [{"PrivateIpAddress": ip} for ip in ips],
            "AssignedIpv4Prefixes": [{"Ipv4Prefix": p} for p in prefixes],
        }
    )


def unassign_response(self: ElasticNetworkInterfaces) -> ActionResult:
    """Frees addresses and prefixes. Like EC2, naming the primary or something the ENI
    does not hold is an error (stock silently ignored both, and ignored prefixes)."""
    eni_id = self._get_param("NetworkInterfaceId")
    eni = self.ec2_backend.get_network_interface(eni_id)
    ips = set(self._get_param("PrivateIpAddresses", []))
    prefixes = set(self._get_param("Ipv4Prefixes", []))
    if eni.private_ip_address in ips:
        raise EC2ClientError(
            "InvalidParameterValue",
            f"The primary IP address of interface {eni_id} cannot be unassigned.",
        )
    held = {item["PrivateIpAddress"] for item in eni.private_ip_addresses}
    if not ips <= held or not prefixes <= set(eni_prefixes(eni)):
        raise EC2ClientError(
            "InvalidParameterValue",
            f"Some of the specified addresses are not assigned to interface {eni_id}",
        )
    eni.private_ip_addresses[:] = [
        item for item in eni.private_ip_addresses if item["PrivateIpAddress"] not in ips
    ]
    eni_prefixes(eni)[:] = [p for p in eni_prefixes(eni) if p not in prefixes]
    return EmptyResult()


# --- Attach / detach / delete / terminate ----------------------------------------------


def _check_attach(eni: NetworkInterface, instance: Instance, device_index: int) -> None:
    if eni.instance is not None:
        raise EC2ClientError("InvalidNetworkInterface.InUse", f"Interface: [{eni.id}] in use.")
    info = _network_info(instance)
    max_enis = info.get("MaximumNetworkInterfaces")
    if max_enis is not None and len(instance.nics) >= max_enis:
        count, kind = len(instance.nics) + 1, instance.instance_type
        raise EC2ClientError(
            "AttachmentLimitExceeded", f"Interface count {count} exceeds the limit for {kind}"
        )
    if device_index in instance.nics:
        raise EC2ClientError(
            "InvalidParameterValue",
            f"Instance '{instance.id}' already has an interface attached at device index "
            f"'{device_index}'.",
        )
    per_eni = info.get("Ipv4AddressesPerInterface")
    if per_eni is not None and ipv4_held(eni) > per_eni:
        raise _limit_error()


def attach_network_interface(self: Any, eni_id: str, instance_id: str, device_index: Any) -> Any:
    """Stock accepted a taken device index (silently replacing the ENI there), no limits."""
    eni = self.get_network_interface(eni_id)
    instance = self.get_instance(instance_id)
    _check_attach(eni, instance, int(device_index))
    instance.attach_eni(eni, int(device_index))
    return eni.attachment


_stock_detach_eni = Instance.detach_eni


def detach_eni(self: Instance, eni: NetworkInterface) -> None:
    """DeleteOnTermination belongs to the attachment: a new attachment starts at false."""
    _stock_detach_eni(self, eni)
    eni.delete_on_termination = False


_stock_delete = NetworkInterfaceBackend.delete_network_interface


def delete_network_interface(self: Any, eni_id: str) -> None:
    eni = self.enis.get(eni_id)
    if eni is not None and eni.instance is not None:
        raise EC2ClientError(
            "InvalidNetworkInterface.InUse",
            f"The network interface '{eni_id}' is currently in use.",
        )
    _stock_delete(self, eni_id)


_stock_terminate = Instance.terminate


def terminate(self: Instance) -> Any:
    """Like EC2: attachments with DeleteOnTermination delete their ENI, the others are
    detached and become available (stock deleted through a path our InUse rule now
    refuses, and left the rest attached). The primary stays in `nics` because moto's
    instance properties read nics[0] for DescribeInstances; it only leaves the ENI table."""
    for index, eni in list(self.nics.items()):
        eni.stop()
        delete = bool(eni.delete_on_termination)
        if index != 0:
            detach_eni(self, eni)
        if delete:
            self.ec2_backend.enis.pop(eni.id, None)
    kept, self.nics = self.nics, {}
    try:
        return _stock_terminate(self)
    finally:
        self.nics = kept


_stock_prep_nics = Instance.prep_nics


def prep_nics(self: Instance, nic_spec: list[dict[str, Any]], *args: Any, **kwargs: Any) -> None:
    """ENIs created by RunInstances default to DeleteOnTermination=true in EC2 (stock: false)."""
    for spec in nic_spec:
        if not spec.get("NetworkInterfaceId") and spec.get("DeleteOnTermination") is None:
            spec["DeleteOnTermination"] = True
    _stock_prep_nics(self, nic_spec, *args, **kwargs)
    if not nic_spec and 0 in self.nics:
        self.nics[0].delete_on_termination = True


# --- Attributes and filters ------------------------------------------------------------

_stock_modify_response = ElasticNetworkInterfaces.modify_network_interface_attribute


def modify_attribute_response(self: ElasticNetworkInterfaces) -> ActionResult:
    """Adds Attachment.DeleteOnTermination (stock dropped it)."""
    attachment_id = self._get_param("Attachment.AttachmentId")
    delete = self._get_param("Attachment.DeleteOnTermination")
    if attachment_id is not None or delete is not None:
        eni = self.ec2_backend.get_network_interface(self._get_param("NetworkInterfaceId"))
        if eni.attachment_id is None or eni.attachment_id != attachment_id:
            raise InvalidNetworkAttachmentIdError(attachment_id)
        if delete is not None:
            eni.delete_on_termination = str(delete).lower() == "true"
    return _stock_modify_response(self)


_stock_filter = NetworkInterface.get_filter_value


def get_filter_value(
    self: NetworkInterface, filter_name: str, method_name: str | None = None
) -> Any:
    """Adds the attachment.* filters the ENI operator uses (stock: HTTP 500)."""
    attached = self.instance is not None
    if filter_name == "attachment.device-index":
        return self.device_index if attached else None
    if filter_name == "attachment.status":
        return "attached" if attached else None
    if filter_name == "attachment.delete-on-termination":
        return bool(self.delete_on_termination) if attached else None
    return _stock_filter(self, filter_name, method_name)


def _ipv4_prefixes(self: NetworkInterface) -> list[dict[str, str]]:
    """Serialised as Ipv4Prefixes in DescribeNetworkInterfaces / CreateNetworkInterface."""
    return [{"Ipv4Prefix": p} for p in eni_prefixes(self)]


PATCHES: list[tuple[type, str, Any]] = [
    (NetworkInterfaceBackend, "create_network_interface", create_network_interface),
    (NetworkInterfaceBackend, "assign_private_ip_addresses", assign_private_ip_addresses),
    (NetworkInterfaceBackend, "attach_network_interface", attach_network_interface),
    (NetworkInterfaceBackend, "delete_network_interface", delete_network_interface),
    (NetworkInterface, "get_filter_value", get_filter_value),
    (NetworkInterface, "ipv4_prefixes", property(_ipv4_prefixes)),
    (Instance, "detach_eni", detach_eni),
    (Instance, "terminate", terminate),
    (Instance, "prep_nics", prep_nics),
    (ElasticNetworkInterfaces, "create_network_interface", create_network_interface_response),
    (ElasticNetworkInterfaces, "assign_private_ip_addresses", assign_response),
    (ElasticNetworkInterfaces, "unassign_private_ip_addresses", unassign_response),
    (ElasticNetworkInterfaces, "modify_network_interface_attribute", modify_attribute_response),
]


def apply() -> None:
    for cls, name, value in PATCHES:
        setattr(cls, name, value)
