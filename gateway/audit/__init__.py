"""The JSON-lines audit log (A1–A3): ``AuditLog`` writes it, ``NullAudit`` discards.

See ``gateway/audit/writer.py`` for how records reach the disk and ``spark/SCHEMA.md`` for
the record schema.
"""

from gateway.audit.record import ADMIN_EVENTS, EVENTS, FIELD_TYPES, SCHEMA_VERSION
from gateway.audit.writer import AuditLog, NullAudit

__all__ = ["ADMIN_EVENTS", "EVENTS", "FIELD_TYPES", "SCHEMA_VERSION", "AuditLog", "NullAudit"]
