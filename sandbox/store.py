"""Object semantics: creates, reads, patches, deletes, unique values and idempotent replay."""

from __future__ import annotations

import time

from pydantic import JsonValue

from sandbox.config import ObjectTypeConfig, SandboxConfig
from sandbox.holder import StateHolder, now_iso
from sandbox.ledger import append_entry
from sandbox.replies import Rejected, Reply, error, parse_json_object, sha256_hex
from sandbox.state import IdempotencyRecord, LedgerKind, SandboxState, StoredObject

Properties = dict[str, str | None]


class ObjectStore:
    """The objects API's behaviour over the shared state; every method returns a `Reply`."""

    def __init__(self, config: SandboxConfig, holder: StateHolder) -> None:
        self._config = config
        self._holder = holder
        # Object id by (type, unique property, value): unique checks and reads by value
        # were a scan of every stored object, ~2 ms per create at 3,000 objects (bench P1).
        # Values are unique by construction (create and patch refuse duplicates); the index
        # belongs to one state object and is rebuilt when the state is loaded or reset.
        self._index: dict[tuple[str, str], dict[str, str]] = {}
        self._indexed: SandboxState | None = None

    def create(self, object_type: str, raw: bytes, idempotency_key: str | None) -> Reply:
        """Create an object, or replay the first answer to a reused `Idempotency-Key`."""
        try:
            type_config = self._type_config(object_type)
            key = idempotency_key if type_config.idempotency else None
            replay = self._replay(type_config, object_type, key, raw, idempotency_key)
            if replay is not None:
                return replay
            properties = _parse_properties(raw)
            self._check_unique(object_type, type_config, properties, exclude_id=None)
        except Rejected as rejected:
            return rejected.reply
        return self._insert(object_type, type_config, properties, raw, idempotency_key, key)

    def read(self, object_type: str, ref: str, id_property: str | None) -> Reply:
        """Read an object by id, or by a unique property's value when `id_property` is given."""
        try:
            obj = self._find(object_type, ref, id_property)
        except Rejected as rejected:
            return rejected.reply
        return Reply(200, render(obj), etag_header(obj))

    def patch(
        self, object_type: str, object_id: str, raw: bytes, if_match: str | None = None
    ) -> Reply:
        """Merge properties into an object; every attempt is written to the ledger.

        With `If-Match`, a stale ETag answers 412 and changes nothing.
        """
        try:
            type_config = self._type_config(object_type)
            properties = _parse_properties(raw)
            obj = self._find(object_type, object_id, None)
            if if_match is not None and if_match != etag(obj):
                raise Rejected(error(412, "PRECONDITION_FAILED", "The object has changed"))
            self._check_unique(object_type, type_config, properties, exclude_id=obj.id)
        except Rejected as rejected:
            self._record("patch", object_type, object_id, raw, rejected.reply.status)
            return rejected.reply
        self._unindex(object_type, obj)
        obj.properties.update(properties)
        self._reindex(object_type, obj)
        obj.updated_at = now_iso()
        obj.version += 1
        self._record("patch", object_type, obj.id, raw, 200, _unique(type_config, properties))
        return Reply(200, render(obj), etag_header(obj))

    def delete(self, object_type: str, object_id: str) -> Reply:
        """Remove an object (HubSpot archives; the sandbox forgets it and frees its values)."""
        try:
            obj = self._find(object_type, object_id, None)
        except Rejected as rejected:
            return rejected.reply
        del self._objects(object_type)[obj.id]
        self._unindex(object_type, obj)
        self._record("delete", object_type, obj.id, b"", 204)
        return Reply(204)

    def list_objects(self, object_type: str) -> list[JsonValue]:
        """Every stored object of a type, in creation order."""
        return [render(obj) for obj in self._objects(object_type).values()]

    def _type_config(self, object_type: str) -> ObjectTypeConfig:
        type_config = self._config.object_types.get(object_type)
        if type_config is None:
            message = f"Unable to infer object type from: {object_type}"
            raise Rejected(error(400, "VALIDATION_ERROR", message))
        return type_config

    def _objects(self, object_type: str) -> dict[str, StoredObject]:
        return self._holder.state.objects.setdefault(object_type, {})

    def _find(self, object_type: str, ref: str, id_property: str | None) -> StoredObject:
        type_config = self._type_config(object_type)
        if id_property is None or id_property == "hs_object_id":
            obj = self._objects(object_type).get(ref)
        elif id_property in type_config.unique_properties:
            obj = self._by_value(object_type, id_property, ref)
        else:
            message = f"Property {id_property} is not a unique identifier for {object_type}"
            raise Rejected(error(400, "VALIDATION_ERROR", message))
        if obj is None:
            raise Rejected(error(404, "OBJECT_NOT_FOUND", f"Object not found. objectId: {ref}"))
        return obj

    def _by_value(self, object_type: str, prop: str, value: str) -> StoredObject | None:
        object_id = self._values(object_type, prop).get(value)
        return None if object_id is None else self._objects(object_type)[object_id]

    def _values(self, object_type: str, prop: str) -> dict[str, str]:
        """Object id by value of one unique property of one type."""
        state = self._holder.state
        if self._indexed is not state:
            self._index, self._indexed = {}, state
            for type_name, objects in state.objects.items():
                for obj in objects.values():  # creation order: the first holder wins
                    self._reindex(type_name, obj)
        return self._index.setdefault((object_type, prop), {})

    def _reindex(self, object_type: str, obj: StoredObject) -> None:
        for prop, value in self._unique_values(object_type, obj).items():
            self._values(object_type, prop).setdefault(value, obj.id)

    def _unindex(self, object_type: str, obj: StoredObject) -> None:
        for prop, value in self._unique_values(object_type, obj).items():
            values = self._values(object_type, prop)
            if values.get(value) == obj.id:
                del values[value]

    def _unique_values(self, object_type: str, obj: StoredObject) -> dict[str, str]:
        type_config = self._config.object_types.get(object_type)
        return {} if type_config is None else _unique(type_config, obj.properties)

    def _check_unique(
        self,
        object_type: str,
        type_config: ObjectTypeConfig,
        properties: Properties,
        exclude_id: str | None,
    ) -> None:
        for prop, value in _unique(type_config, properties).items():
            existing = self._by_value(object_type, prop, value)
            if existing is not None and existing.id != exclude_id:
                raise Rejected(_conflict(object_type, prop, value, existing.id))

    def age_keys(self, seconds: float) -> int:
        """Make every stored idempotency key `seconds` older (tests: as if that much time
        passed for the remote's keys); how many keys there are."""
        records = [r for keys in self._holder.state.idempotency.values() for r in keys.values()]
        for record in records:
            record.stored_at_s -= seconds
        self._holder.commit()
        return len(records)

    def _replay(
        self,
        type_config: ObjectTypeConfig,
        object_type: str,
        key: str | None,
        raw: bytes,
        sent_key: str | None,
    ) -> Reply | None:
        if key is None:
            return None
        record = self._holder.state.idempotency.get(object_type, {}).get(key)
        if record is None:
            return None
        if time.time() - record.stored_at_s > type_config.idempotency_key_ttl_s:
            return None  # forgotten (G-5): the request is new, and the key is stored again
        if record.body_sha256 != sha256_hex(raw):
            message = "Idempotency-Key was already used with a different request body"
            raise Rejected(error(422, "VALIDATION_ERROR", message))
        self._record(
            "create", object_type, record.object_id, raw, record.status, key=sent_key, replayed=True
        )
        return Reply(record.status, record.body, {"Idempotent-Replayed": "true"})

    def _insert(
        self,
        object_type: str,
        type_config: ObjectTypeConfig,
        properties: Properties,
        raw: bytes,
        sent_key: str | None,
        key: str | None,
    ) -> Reply:
        state = self._holder.state
        object_id, state.next_id = str(state.next_id), state.next_id + 1
        at = now_iso()
        obj = StoredObject(id=object_id, properties=properties, created_at=at, updated_at=at)
        self._objects(object_type)[object_id] = obj
        self._reindex(object_type, obj)
        body = render(obj)
        if key is not None:
            record = IdempotencyRecord(
                body_sha256=sha256_hex(raw),
                object_id=object_id,
                status=201,
                body=body,
                stored_at_s=time.time(),
            )
            state.idempotency.setdefault(object_type, {})[key] = record
        unique = _unique(type_config, properties)
        self._record("create", object_type, object_id, raw, 201, unique, key=sent_key)
        return Reply(201, body, etag_header(obj))

    def _record(
        self,
        kind: LedgerKind,
        object_type: str,
        object_id: str | None,
        raw: bytes,
        status: int,
        unique_values: dict[str, str] | None = None,
        *,
        key: str | None = None,
        replayed: bool = False,
    ) -> None:
        append_entry(
            self._holder,
            kind,
            object_type,
            object_id,
            raw,
            status,
            unique_values,
            key=key,
            replayed=replayed,
        )


def etag(obj: StoredObject) -> str:
    """The object's current entity tag (changes with every applied PATCH)."""
    return f'"{obj.version}"'


def etag_header(obj: StoredObject) -> dict[str, str]:
    return {"ETag": etag(obj)}


def render(obj: StoredObject) -> JsonValue:
    """The HubSpot-shaped JSON of an object."""
    system = {
        "hs_object_id": obj.id,
        "createdate": obj.created_at,
        "lastmodifieddate": obj.updated_at,
    }
    return {
        "id": obj.id,
        "properties": {**obj.properties, **system},
        "createdAt": obj.created_at,
        "updatedAt": obj.updated_at,
        "archived": False,
    }


def _parse_properties(raw: bytes) -> Properties:
    properties = parse_json_object(raw).get("properties")
    if not isinstance(properties, dict):
        message = "Request body must carry a 'properties' object"
        raise Rejected(error(400, "VALIDATION_ERROR", message))
    return {name: _as_text(name, value) for name, value in properties.items()}


def _as_text(name: str, value: JsonValue) -> str | None:
    # HubSpot stores every property value as a string.
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    message = f"Property values were not valid: {name} must be a scalar"
    raise Rejected(error(400, "VALIDATION_ERROR", message))


def _unique(type_config: ObjectTypeConfig, properties: Properties) -> dict[str, str]:
    return {p: v for p in type_config.unique_properties if (v := properties.get(p))}


def _conflict(object_type: str, prop: str, value: str, existing_id: str) -> Reply:
    if object_type == "contacts" and prop == "email":
        message = f"Contact already exists. Existing ID: {existing_id}"
    else:
        message = f"A {object_type} object with {prop} '{value}' already exists. "
        message += f"Existing ID: {existing_id}"
    return error(409, "CONFLICT", message)
