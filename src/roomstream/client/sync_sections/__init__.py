"""``/sync`` as one section per token part (see :mod:`.base` for the protocol).

:data:`SECTIONS` is the registration list: its order is the order of the token's
parts (``<events>_<account_data>_<receipts>_<to_device>_<typing>_<device_lists>_<presence>``)
and the order sections collect in. A new section is a new module here with a
:class:`SyncSection` subclass (built by its ``from_services``) and one line appended to
:data:`SECTIONS` (plus a field of :class:`SyncServices` if it reads from something new);
appended, so tokens
issued before it parse (a missing part is the section's ``ZERO``). Never reorder or
remove an entry: old tokens would mean something else.
"""

from __future__ import annotations

from roomstream.client.sync_sections.account_data import AccountDataSection
from roomstream.client.sync_sections.base import SyncContext, SyncSection, SyncServices
from roomstream.client.sync_sections.device_lists import DeviceListsSection
from roomstream.client.sync_sections.presence import PresenceSection
from roomstream.client.sync_sections.receipts import ReceiptsSection
from roomstream.client.sync_sections.rooms import RoomsSection
from roomstream.client.sync_sections.to_device import ToDeviceSection
from roomstream.client.sync_sections.typing import TypingSection

__all__ = ["SECTIONS", "SyncContext", "SyncSection", "SyncServices", "build_sections"]

#: The sections, in token order (append only).
SECTIONS: tuple[type[SyncSection], ...] = (
    RoomsSection,
    AccountDataSection,
    ReceiptsSection,
    ToDeviceSection,
    TypingSection,
    DeviceListsSection,
    PresenceSection,
)


def build_sections(services: SyncServices) -> tuple[SyncSection, ...]:
    """One instance of each of :data:`SECTIONS`, in its order."""
    return tuple(section.from_services(services) for section in SECTIONS)
