"""``TenantPrefixes``: the prefix ids given to each tenant; a tenant may name only its own.

A tenant's blocks are hashed with its own salt, so no other tenant is ever given the same
prefix id; another tenant's id is, to one, an id never issued (400 ``unknown prefix``). Only
the last ``remembered`` ids are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from agentclaims.contract import ClaimSpec, prefix_id_of
from agentclaims.errors import UsageError
from agentclaims.gateway.tenants import Tenant

__all__ = ["TenantPrefixes"]


class TenantPrefixes:
    """Prefix ids given to tenants -> the tenant (the last ``remembered``)."""

    def __init__(self, remembered: int) -> None:
        self._remembered = remembered
        self._tenant: OrderedDict[str, str] = OrderedDict()

    def own(self, prefix_ids: Any, tenant: Tenant) -> None:
        """The prefix ids a completion gave ``tenant``: its own from now on (a tenant's blocks
        are hashed with its own salt, so no other tenant is ever given the same id)."""
        if isinstance(prefix_ids, str):
            self._tenant[prefix_ids] = tenant.name
            self._tenant.move_to_end(prefix_ids)
            while len(self._tenant) > self._remembered:
                self._tenant.popitem(last=False)
        elif isinstance(prefix_ids, Mapping):
            for value in prefix_ids.values():
                self.own(value, tenant)
        elif isinstance(prefix_ids, list | tuple):
            for value in prefix_ids:
                self.own(value, tenant)

    def owns(self, prefix_id: str, tenant: Tenant | None) -> bool:
        """Whether ``tenant`` may name ``prefix_id``: one it was given (any, without keys; an
        operator's key, any). Another tenant's id is, to it, an id never issued."""
        if tenant is None or tenant.admin:
            return True
        return self._tenant.get(prefix_id) == tenant.name

    def check(self, spec: ClaimSpec, hashes: Sequence[int] | None, tenant: Tenant | None) -> None:
        """A claim on its own names a prefix ``tenant`` was given, and ``hashes`` (if any) are
        that prefix's: else 400 ``unknown prefix``, as for an id never issued (nothing says
        whether another tenant has it)."""
        if tenant is None or tenant.admin:
            return
        named = spec.object_id
        if hashes is not None and (not hashes or prefix_id_of(list(hashes)) != named):
            raise UsageError("block_hashes", f"are not the blocks of prefix {named!r}")
        self.own_or_unknown(named, tenant)

    def own_or_unknown(self, prefix_id: str, tenant: Tenant) -> None:
        """``tenant``'s own prefix, or the 400 an id never issued gets."""
        if not self.owns(prefix_id, tenant):
            raise UsageError("object_id", f"unknown prefix {prefix_id!r}: serve it first")
