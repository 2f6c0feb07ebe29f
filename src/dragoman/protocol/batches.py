"""Message Batches API wire types (the SDK's `types/messages/message_batch*.py`)."""

from __future__ import annotations

from typing import Literal

import msgspec


class BatchRequest(msgspec.Struct, forbid_unknown_fields=True):
    custom_id: str
    params: msgspec.Raw  # a Messages request, validated when it is run (as Anthropic does)


class BatchCreate(msgspec.Struct):
    requests: list[BatchRequest]


class RequestCounts(msgspec.Struct):
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(msgspec.Struct, omit_defaults=False):
    id: str
    created_at: str
    expires_at: str
    request_counts: RequestCounts
    processing_status: Literal["in_progress", "canceling", "ended"] = "in_progress"
    type: Literal["message_batch"] = "message_batch"
    ended_at: str | None = None
    cancel_initiated_at: str | None = None
    archived_at: str | None = None
    results_url: str | None = None


class DeletedBatch(msgspec.Struct):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


BATCH_CREATE = msgspec.json.Decoder(BatchCreate)
