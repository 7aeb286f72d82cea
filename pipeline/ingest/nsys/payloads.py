"""NCCL NVTX extended payloads: decoding the binary blobs `nsys export --include-blobs=true`
stores (decode_payload_blob, schema_of_blob) and staging them as tables nccl_payload and
launch_payload (_nccl_payloads), from which the collectives get message size, communicator and
group size."""

from __future__ import annotations

import re

from .export import NsysError
from .readers import _small

# NCCL's NVTX API ranges that carry a message size (NCCL src/collectives.cc NVTX3_FUNC_WITH_PARAMS;
# group and communicator ranges carry none)
_NCCL_API = re.compile(
    r"^nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Bcast|Reduce|Send|Recv|AlltoAll|Gather|Scatter)$"
)
_BLOB_HEADER = 32


def decode_payload_blob(blob, entries: list[dict], payload_size: int | None) -> dict[str, int]:
    """Fields of one NVTX extended payload as `nsys export --include-blobs=true` stores it:
    a 32-byte little-endian header [domainId u64][schemaId u64][payloadSize u64][payloadOffset u64]
    then the payload, laid out by NVTX_PAYLOAD_SCHEMA_ENTRIES (offset of each entry; an entry
    ends where the next begins, the last at the schema's payloadSize). Layout as decoded by
    GindaChen/nsys-ai src/nsys_ai/nccl_communicator.py; entries from NCCL's nvtx_payload_schemas.h.
    blob: bytes or hex text. Returns {entry name: unsigned int}; raises ValueError when malformed."""
    raw = bytes.fromhex(blob) if isinstance(blob, str) else bytes(blob)
    if len(raw) < _BLOB_HEADER:
        raise ValueError(f"payload blob of {len(raw)} bytes is shorter than its header")
    size = int.from_bytes(raw[16:24], "little")
    off = int.from_bytes(raw[24:32], "little")
    payload = raw[off : off + size]
    if off < _BLOB_HEADER or len(payload) != size:
        raise ValueError("payload blob offset/size do not fit the blob")
    out = {}
    ends = [e["offset"] or 0 for e in entries[1:]] + [payload_size or size]
    for e, end in zip(entries, ends):
        chunk = payload[(e["offset"] or 0) : end]
        if chunk:
            out[e["name"]] = int.from_bytes(chunk[:8], "little")
    return out


def schema_of_blob(blob) -> tuple[int, int]:
    raw = bytes.fromhex(blob) if isinstance(blob, str) else bytes(blob)
    return int.from_bytes(raw[0:8], "little"), int.from_bytes(raw[8:16], "little")


def _nccl_payloads(ex, con, notes: list[str]) -> int:
    """Decode the NCCL API ranges' payloads into table nccl_payload and attach each to the CUDA
    launch inside it (launch_payload: the innermost NCCL API range on the launching thread that
    holds the whole call; NCCL's API ranges do not nest, so an ASOF join on the latest start finds
    it). Returns the number of payloads decoded."""
    con.execute(
        'CREATE TABLE nccl_payload (globalTid BIGINT, start BIGINT, "end" BIGINT, api VARCHAR, '
        "bytes BIGINT, comm_id VARCHAR, nranks BIGINT)"
    )
    try:
        rows = ex.payload_rows()
    except NsysError as e:  # the payloads are extra: the rest of the export is still read
        notes.append(f"{e}: its NCCL payloads (message sizes, communicators) were not read")
        rows = []
    if rows:
        strings = dict(
            con.execute(
                "SELECT id, value FROM strings WHERE id IN (SELECT DISTINCT textId FROM nvtx "
                "WHERE textId IS NOT NULL "
                "AND domainId IN (SELECT domainId FROM domains WHERE domain = 'NCCL'))"
            ).fetchall()
        )
        entries: dict[tuple, dict[int, dict]] = {}
        for r in _small(ex, "NVTX_PAYLOAD_SCHEMA_ENTRIES", ["domainId", "schemaId", "idx", "name", "offset"]):
            entries.setdefault((r["domainId"], r["schemaId"]), {}).setdefault(r["idx"], r)
        sizes = {
            (r["domainId"], r["schemaId"]): r["payloadSize"]
            for r in _small(ex, "NVTX_PAYLOAD_SCHEMAS", ["domainId", "schemaId", "payloadSize"])
        }
        out, bad = [], 0
        for tid, start, end, text, text_id, blob in rows:
            api = text if text is not None else strings.get(text_id)
            if not api or not _NCCL_API.match(api):
                continue
            try:
                key = schema_of_blob(blob)
                ents = [entries[key][i] for i in sorted(entries.get(key, {}))]
                if not ents:
                    raise ValueError(f"no schema entries for domain {key[0]} schema {key[1]}")
                f = decode_payload_blob(blob, ents, sizes.get(key))
            except ValueError:
                bad += 1
                continue
            comm = f.get("NCCL communicator ID")
            out.append(
                (
                    tid,
                    start,
                    end,
                    api,
                    f.get("Message size [bytes]"),
                    None if comm is None else f"0x{comm:016x}",
                    f.get("No. of ranks"),
                )
            )
        if out:
            con.executemany("INSERT INTO nccl_payload VALUES (?, ?, ?, ?, ?, ?, ?)", out)
        if bad:
            notes.append(f"{bad} NCCL NVTX payload blobs could not be decoded")
    con.execute("""CREATE TABLE launch_payload AS
        SELECT m.rank, rt.correlationId AS correlation, p.api, p.bytes, p.comm_id, p.nranks
        FROM (SELECT globalTid, start, "end", correlationId FROM runtime WHERE correlationId IS NOT NULL) rt
        ASOF JOIN nccl_payload p ON p.globalTid = rt.globalTid AND rt.start >= p.start
        JOIN rank_map m ON m.gp = rt.globalTid & ~16777215
        WHERE rt."end" <= p."end"
        """)
    return len(rows)
