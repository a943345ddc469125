"""Real MaxResults / NextToken pagination for DescribeNetworkInterfaces, DescribeSubnets and
DescribeInstances (stock ignored it on the first two and paged DescribeInstances by
reservation with a silent cap of 100 reservations when MaxResults was absent).

Items are ordered by ID and the token names the last ID returned, so a page boundary stays
correct when items are created or deleted between calls.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError, InvalidParameterCombination
from moto.ec2.responses.elastic_network_interfaces import ElasticNetworkInterfaces
from moto.ec2.responses.instances import InstanceResponse
from moto.ec2.responses.subnets import Subnets

MIN_RESULTS, MAX_RESULTS = 5, 1000


def _encode(last_id: str) -> str:
    return base64.urlsafe_b64encode(f"meshwork:{last_id}".encode()).decode()


def _decode(token: str) -> str:
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
    except ValueError:
        text = ""
    if not text.startswith("meshwork:"):
        raise EC2ClientError("InvalidPaginationToken", f"Invalid pagination token: {token}")
    return text.removeprefix("meshwork:")


def page(
    response: Any, items: list[Any], ids_given: bool, ids_param: str
) -> tuple[list[Any], str | None]:
    """The page of `items` (objects with `.id`) that MaxResults/NextToken select, and the
    token for the next page (None on the last). Without either parameter: everything."""
    max_results = response._get_int_param("MaxResults")
    token = response._get_param("NextToken")
    if max_results is not None and ids_given:
        raise InvalidParameterCombination(
            f"The parameter {ids_param} cannot be used with the parameter maxResults"
        )
    if max_results is not None and not MIN_RESULTS <= max_results <= MAX_RESULTS:
        raise EC2ClientError(
            "InvalidParameterValue",
            f"Value ( {max_results} ) for parameter maxResults is invalid. "
            f"Expecting a value between {MIN_RESULTS} and {MAX_RESULTS}.",
        )
    items = sorted(items, key=lambda item: item.id)
    if token:
        last = _decode(token)
        items = [item for item in items if item.id > last]
    if max_results is None or len(items) <= max_results:
        return items, None
    selected = items[:max_results]
    return selected, _encode(selected[-1].id)


def describe_network_interfaces(self: ElasticNetworkInterfaces) -> ActionResult:
    ids = self._get_param("NetworkInterfaceIds", [])
    filters = self._filters_from_querystring()
    self.error_on_dryrun()
    enis = self.ec2_backend.get_all_network_interfaces(ids, filters)
    selected, token = page(self, enis, bool(ids), "networkInterfaceIdSet")
    return ActionResult({"NetworkInterfaces": selected, "NextToken": token})


def describe_subnets(self: Subnets) -> ActionResult:
    self.error_on_dryrun()
    ids = self._get_param("SubnetIds")
    subnets = self.ec2_backend.describe_subnets(ids, self._filters_from_querystring())
    selected, token = page(self, subnets, bool(ids), "subnetIds")
    return ActionResult({"Subnets": selected, "NextToken": token})


def describe_instances(self: InstanceResponse) -> ActionResult:
    """Pages by instance, as EC2 does; a reservation split across pages appears on each
    page with the instances of that page."""
    self.error_on_dryrun()
    filters = self._filters_from_querystring()
    ids = self._get_param("InstanceIds", [])
    if ids:
        reservations = self.ec2_backend.get_reservations_by_instance_ids(ids, filters=filters)
    else:
        reservations = self.ec2_backend.describe_instances(filters=filters)
    owner = {inst.id: r for r in reservations for inst in r.instances}
    instances = [inst for r in reservations for inst in r.instances]
    selected, token = page(self, instances, bool(ids), "instancesSet")
    chosen = {inst.id for inst in selected}
    result = []
    for reservation in reservations:
        part = [inst for inst in reservation.instances if inst.id in chosen]
        if part:
            shown = copy.copy(owner[part[0].id])
            shown.instances = part
            result.append(shown)
    return ActionResult({"Reservations": result, "NextToken": token})


def apply() -> None:
    ElasticNetworkInterfaces.describe_network_interfaces = describe_network_interfaces
    Subnets.describe_subnets = describe_subnets
    InstanceResponse.describe_instances = describe_instances
