"""moto patched to behave like EC2 where Meshwork's ENI IPAM operator depends on it.

Run as ``python -m meshwork_moto --host 127.0.0.1 --port P`` (with this directory's parent
on PYTHONPATH): it applies the patches below, then serves moto like ``moto_server`` does.
Checked against moto 5.2.5; each patch says what stock moto did instead.

1. Addresses (addresses.py, enis.py). Stock drew secondary addresses at random, unique only
   per ENI: two ENIs got the same address, the network and broadcast addresses were handed
   out, and AvailableIpAddressCount went negative. Now one allocator serves ENI primaries,
   secondaries and instance primaries: lowest free address of the subnet, never .0, .1, .2,
   .3 or the broadcast, unique across every ENI and instance; AvailableIpAddressCount is
   derived from what is held and never negative. Named addresses already held by another
   ENI fail with InvalidIPAddress.InUse.
2. Exhaustion. Asking for more than the subnet has free looped forever at 100 % CPU (random
   retry); now the allocator scans once and fails with InsufficientFreeAddressesInSubnet.
   Every IPv4 allocation path (CreateNetworkInterface, AssignPrivateIpAddresses,
   RunInstances, other services' get_available_subnet_ip) goes through it.
3. Limits (enis.py), from moto's instance-type data. An attached ENI may hold the type's
   Ipv4AddressesPerInterface (primary and each /28 prefix count one), else
   PrivateIpAddressLimitExceeded; an instance may hold MaximumNetworkInterfaces ENIs, else
   AttachmentLimitExceeded. An unattached ENI has no type yet: it may hold the largest
   per-interface limit of any type, and attaching it to a type whose limit it exceeds fails
   with PrivateIpAddressLimitExceeded. (RunInstances itself is not limited.)
4. AttachNetworkInterface at a device index already used fails with InvalidParameterValue
   "Instance '<id>' already has an interface attached at device index '<n>'." (stock
   replaced the ENI at that index); attaching an attached ENI fails with
   InvalidNetworkInterface.InUse.
5. DeleteNetworkInterface of an attached ENI fails with InvalidNetworkInterface.InUse
   (stock deleted it). TerminateInstances therefore detaches first: ENIs whose attachment
   has DeleteOnTermination are deleted, the others become available; ENIs made by
   RunInstances default to DeleteOnTermination=true as in EC2.
6. Prefix delegation: Ipv4PrefixCount on CreateNetworkInterface / AssignPrivateIpAddresses
   allocates /28 prefixes aligned on /28 boundaries and disjoint from every address and
   prefix in the subnet (stock ignored it); no free aligned /28 fails with
   InsufficientCidrBlocks. Prefixes show as Ipv4Prefixes / AssignedIpv4Prefixes, count 16
   against AvailableIpAddressCount and one against the per-ENI limit;
   UnassignPrivateIpAddresses with Ipv4Prefixes frees them. AssignPrivateIpAddresses
   answers only the newly assigned addresses (stock: all of the ENI's).
7. The DescribeNetworkInterfaces filters attachment.device-index (stock: HTTP 500),
   attachment.status and attachment.delete-on-termination; ModifyNetworkInterfaceAttribute
   Attachment.DeleteOnTermination is stored (stock dropped it); MaxResults/NextToken
   pagination on DescribeNetworkInterfaces, DescribeSubnets, DescribeInstances
   (pagination.py).
8. Fault injection, call counters and reset (control.py): see that module's docstring.
"""

from __future__ import annotations

_applied = False


def apply() -> None:
    """Applies every patch once (import-time side effects stay out of the modules)."""
    global _applied
    if _applied:
        return
    from . import addresses, enis, pagination

    addresses.apply()
    enis.apply()
    pagination.apply()
    _applied = True
